-- The request-path functions. All are C; none is STRICT, so that a NULL
-- argument gets a clear error instead of a silent NULL result.

CREATE FUNCTION idem_key(principal text, method text, target text, key text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_key(text, text, text, text) IS
    'cache key: SHA-256 of the length-delimited (principal, method, target, key) tuple';

CREATE FUNCTION idem_request_hash(body bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_request_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_request_hash(bytea) IS
    'request hash: SHA-256 of the request body (same as sha256(body))';

CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL,
                           max_wait interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_claim(bytea, bytea, interval, interval) IS
    'claim a key for one execution, or learn what a follower should do (waiting up to max_wait for the winner)';

-- The same with lock_wait, the longest each wait on another transaction's
-- lock on the key may last, for this call only (keys/lock_wait.c).  A
-- signature of its own, every argument given (NULL for a default): with a
-- default for lock_wait it would be ambiguous beside the four-argument
-- form, which stays because the clients released before 0.6.0 look for
-- it to learn that the server can wait (max_wait).
CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval,
                           max_wait interval, lock_wait interval)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_claim(bytea, bytea, interval, interval, interval) IS
    'idem_claim, each wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';

CREATE FUNCTION idem_lookup(cache_key bytea, request_hash bytea)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE;
COMMENT ON FUNCTION idem_lookup(bytea, bytea) IS
    'read-only view of a key, in the shape of idem_claim (a follower''s poll)';

CREATE FUNCTION idem_renew(cache_key bytea, claim_id uuid,
                           lease interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_renew'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_renew(bytea, uuid, interval) IS
    'extend an owned lease; NULL when the claim is no longer owned';

-- With lock_wait, as idem_claim: a lease keeper must not outwait its own
-- lease behind a take-over in flight.
CREATE FUNCTION idem_renew(cache_key bytea, claim_id uuid, lease interval, lock_wait interval)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_renew'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_renew(bytea, uuid, interval, interval) IS
    'idem_renew, a wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';

CREATE FUNCTION idem_finalize(cache_key bytea, claim_id uuid, status integer,
                              headers jsonb, body bytea,
                              strict boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_finalize'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_finalize(bytea, uuid, integer, jsonb, bytea, boolean) IS
    'store the response of an owned claim; strict raises IL001 when not owned';

CREATE FUNCTION idem_release(cache_key bytea, claim_id uuid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_release(bytea, uuid) IS
    'give an owned key up without caching anything: claimable again at once';

CREATE FUNCTION idem_fail(cache_key bytea, claim_id uuid,
                          cooldown interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_fail(bytea, uuid, interval) IS
    'mark an owned key failed; same-request claims get cooldown until it ends';

CREATE FUNCTION idem_cleanup(batch integer DEFAULT 1000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_cleanup(integer) IS
    'drop responses past idem.ttl and delete finished keys past idem.tombstone_ttl, at most batch keys';
