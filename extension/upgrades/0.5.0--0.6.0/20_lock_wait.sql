-- idem_claim, idem_begin and idem_renew with lock_wait (keys/lock_wait.c):
-- the clients' budget for a wait on another transaction's lock on the key,
-- which up to 0.5.0 they set as lock_timeout around the call.  New
-- signatures beside the old ones (see install/20_claims.sql for why the
-- old ones stay and the new ones have no defaults), granted to idem_client
-- by 90_privileges.  The C entry points read lock_wait only when it is
-- passed, so the library of 0.6.0 serves 0.5.0's definitions during a
-- rolling upgrade.
CREATE FUNCTION @extschema@.idem_claim(cache_key bytea, request_hash bytea, lease interval,
                                       max_wait interval, lock_wait interval)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_claim(bytea, bytea, interval, interval, interval) IS
    'idem_claim, each wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';

CREATE FUNCTION @extschema@.idem_begin(cache_key bytea, request_hash bytea, lease interval,
                                       max_wait interval, lock_wait interval)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_begin(bytea, bytea, interval, interval, interval) IS
    'idem_begin, each wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';

CREATE FUNCTION @extschema@.idem_renew(cache_key bytea, claim_id uuid, lease interval,
                                       lock_wait interval)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_renew'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_renew(bytea, uuid, interval, interval) IS
    'idem_renew, a wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';
