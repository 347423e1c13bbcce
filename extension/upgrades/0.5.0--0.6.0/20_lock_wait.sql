-- idem_claim, idem_begin and idem_renew take lock_wait (keys/lock_wait.c):
-- the clients' budget for a wait on another transaction's lock on the key,
-- which they set as lock_timeout around the call up to 0.5.0.  A new last
-- argument with a default is a new signature: the old one goes, and a call
-- with the old arguments (every released client's) resolves to the new
-- function.  90_privileges grants the new functions again.  The C entry
-- points read lock_wait only when it is passed, so a library of 0.6.0
-- serves the 0.5.0 definitions during a rolling upgrade.
DROP FUNCTION @extschema@.idem_claim(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval,
                                     pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_claim(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL,
                                       lock_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_claim(bytea, bytea, interval, interval, interval) IS
    'claim a key for one execution, or learn what a follower should do (waiting up to max_wait for the winner, up to lock_wait for a lock on the key)';

DROP FUNCTION @extschema@.idem_begin(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval,
                                     pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_begin(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL,
                                       lock_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_begin(bytea, bytea, interval, interval, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

DROP FUNCTION @extschema@.idem_renew(pg_catalog.bytea, pg_catalog.uuid, pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_renew(cache_key bytea, claim_id uuid,
                                       lease interval DEFAULT NULL,
                                       lock_wait interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_renew'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_renew(bytea, uuid, interval, interval) IS
    'extend an owned lease; NULL when the claim is no longer owned';
