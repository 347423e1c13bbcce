-- In-transaction mode: the claim, the handler's writes and the finalize
-- commit together, in the caller's transaction.

CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL,
                           max_wait interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

-- With lock_wait (see idem_claim's): for this call only, so the handler
-- after it runs with the transaction's own lock_timeout.
CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea, lease interval,
                           max_wait interval, lock_wait interval)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval, interval, interval) IS
    'idem_begin, each wait on another transaction''s lock on the key at most lock_wait (NULL: lock_timeout)';

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
