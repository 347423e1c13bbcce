-- The SQL edition of in-transaction mode (keys/claim.c's idem_begin and
-- keys/in_transaction_guard.c): the claim, the handler's writes and the
-- finalize commit together, in the caller's transaction.  Duplicates wait
-- on the uncommitted row, as ON CONFLICT and UPDATE do.

-- @symbol idem_begin
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, true, CURRENT_USER)::@extschema@.idem__claim_call::@extschema@.idem_claim_result;
END
$function$
-- @end

-- @symbol idem_begin/5
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    a_us pg_catalog.numeric;
    a_saved pg_catalog.text;
    a_result @extschema@.idem_claim_result;
BEGIN
    {{lock_wait_arg($5)}}
    a_result := ROW($1, $2, $3, $4, true, CURRENT_USER)::@extschema@.idem__claim_call::@extschema@.idem_claim_result;
    {{lock_wait_restore()}}
    RETURN a_result;
END
$function$
-- @end

-- The deferred constraint trigger, queued only for rows idem_begin wrote:
-- at commit, a claim still pending under the claim that queued it was
-- never finished.  It reads idem_keys, which the committing role may not:
-- it runs as the tables' owner.
-- @symbol idem_keys_claim_finished
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_keys_claim_finished" must be fired AFTER INSERT OR UPDATE FOR EACH ROW';
    END IF;
    -- Finished, released or taken over later in the transaction: fine.
    IF EXISTS (SELECT FROM @extschema@.idem_keys k
                WHERE k.cache_key = NEW.cache_key AND k.scope = NEW.scope
                  AND k.state = 'pending' AND k.in_transaction
                  AND k.claim_id = NEW.claim_id AND k.generation = NEW.generation) THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:claim_unfinished}},
            MESSAGE = 'idempotency claim begun in this transaction was not finished',
            DETAIL = pg_catalog.format('Key %s is still pending at commit.', NEW.cache_key),
            HINT = 'Call idem_finalize, idem_release or idem_fail before COMMIT, or roll back.',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, CONSTRAINT = 'idem_keys_claim_finished';
    END IF;
    RETURN NULL;
END
$function$
-- @end
