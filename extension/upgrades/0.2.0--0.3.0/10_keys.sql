-- Keys: role scopes (scope.c), the expired state of the two horizons
-- (lifetime.c), and the follower's server-side wait (max_wait).

-- Keys written by 0.2.0 had no owner: they get the empty scope, shared by
-- every role until they expire, as they were before.  (The functions
-- always give a scope; the default is for rows written by hand.)
ALTER TABLE @extschema@.idem_keys ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE @extschema@.idem_keys DROP CONSTRAINT idem_keys_pkey,
    ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key, scope);
ALTER TABLE @extschema@.idem_keys DROP CONSTRAINT idem_keys_state,
    ADD CONSTRAINT idem_keys_state
        CHECK (state IN ('pending', 'completed', 'failed', 'expired'));
COMMENT ON COLUMN @extschema@.idem_keys.scope IS
    'the role whose key this is (role isolation); empty for keys written before 0.3.0, shared by every role';
COMMENT ON COLUMN @extschema@.idem_keys.state IS
    'pending (claimed), completed (response kept), failed (cooldown), expired (past idem.ttl: response dropped, fingerprint kept)';

-- A fourth argument, max_wait: a new signature.  Calls with three
-- arguments (0.2 clients) resolve to the new function.
DROP FUNCTION @extschema@.idem_claim(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_claim(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_claim(bytea, bytea, interval, interval) IS
    'claim a key for one execution, or learn what a follower should do (waiting up to max_wait for the winner)';

DROP FUNCTION @extschema@.idem_begin(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_begin(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_begin(bytea, bytea, interval, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

COMMENT ON FUNCTION @extschema@.idem_cleanup(integer) IS
    'drop responses past idem.ttl and delete finished keys past idem.tombstone_ttl, at most batch keys';
