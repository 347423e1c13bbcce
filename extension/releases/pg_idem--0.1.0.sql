-- pg_idem 0.1.0: claims and in-transaction mode.  Frozen: this is what 0.1.0
-- installed; later versions change it only through upgrade scripts.
\echo Use "CREATE EXTENSION pg_idem VERSION '0.1.0'" to load this file. \quit

-- extension/sql/10_keys.sql at 0.1.0
-- State of every idempotency key: one row per key, keyed by a SHA-256
-- digest so that no caller-controlled string ever reaches the index.
--
-- Only the primary key is indexed: renew and finalize change no indexed
-- column, so with the fillfactor headroom they are HOT updates.
CREATE TABLE idem_keys (
    cache_key        bytea       NOT NULL,
    state            text        NOT NULL,
    request_hash     bytea,
    claim_id         uuid,
    generation       bigint      NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at      timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    replayable       boolean     NOT NULL DEFAULT true,
    in_transaction   boolean     NOT NULL DEFAULT false,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key),
    CONSTRAINT idem_keys_state CHECK (state IN ('pending', 'completed', 'failed')),
    CONSTRAINT idem_keys_cache_key_length CHECK (octet_length(cache_key) = 32),
    CONSTRAINT idem_keys_request_hash_length
        CHECK (request_hash IS NULL OR octet_length(request_hash) = 32),
    CONSTRAINT idem_keys_completed_has_response
        CHECK (state <> 'completed' OR NOT replayable
               OR (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT idem_keys_pending_has_claim
        CHECK (state <> 'pending'
               OR (request_hash IS NOT NULL AND claim_id IS NOT NULL
                   AND lease_expires_at IS NOT NULL)),
    CONSTRAINT idem_keys_failed_has_cooldown
        CHECK (state <> 'failed' OR lease_expires_at IS NOT NULL),
    CONSTRAINT idem_keys_status_range
        CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599)
) WITH (fillfactor = 70);

COMMENT ON TABLE idem_keys IS
    'pg_idem: one row per idempotency key; written only through the idem_* functions';
COMMENT ON COLUMN idem_keys.generation IS
    'fencing number: strictly increases with every successful claim or steal of the key';
COMMENT ON COLUMN idem_keys.in_transaction IS
    'claimed by idem_begin: must be finished before its transaction commits';

-- Generations come from one sequence so that a key's generation never goes
-- back, not even after its row was released, cleaned up or evicted.
CREATE SEQUENCE idem_generation_seq AS bigint;

-- Keep the cached responses in pg_dump output: restoring a database without
-- them would re-run every request retried after the restore.
SELECT pg_catalog.pg_extension_config_dump('idem_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idem_generation_seq', '');

-- What idem_claim, idem_begin and idem_lookup answer.
CREATE TYPE idem_claim_result AS (
    outcome          text,
    claim_id         uuid,
    generation       bigint,
    lease_expires_at timestamptz,
    retry_after      interval,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea
);

-- extension/sql/20_claims.sql at 0.1.0
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
                           lease interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_claim(bytea, bytea, interval) IS
    'claim a key for one execution, or learn what a follower should do';

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
    'delete at most batch finished keys older than idem.ttl';

-- extension/sql/30_in_transaction.sql at 0.1.0
-- In-transaction mode: the claim, the handler's writes and the finalize
-- commit together, in the caller's transaction.

CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

CREATE FUNCTION idem_keys_claim_finished()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_keys_claim_finished'
LANGUAGE C;

-- Queued only for rows idem_begin wrote, checked at commit.
CREATE CONSTRAINT TRIGGER idem_keys_claim_finished
    AFTER INSERT OR UPDATE ON idem_keys
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND NEW.in_transaction)
    EXECUTE FUNCTION idem_keys_claim_finished();
