-- In-transaction mode: the claim, the handler's writes and the finalize
-- commit together, in the caller's transaction.

-- lock_wait applies to this call only: the handler after it runs with the
-- transaction's own lock_timeout.
CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL,
                           max_wait interval DEFAULT NULL,
                           lock_wait interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval, interval, interval) IS
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
