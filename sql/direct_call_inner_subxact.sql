-- Pins a fix from the review of the direct path (keys/key_table.c): subxact_callback runs
-- forget_aborted_call for *any* subtransaction that aborts while a call is
-- in progress, also one begun and ended inside the call (a trigger's
-- EXCEPTION block).  The running call then has in_use and query_started
-- cleared: key_table_close skips AfterTriggerEndQuery, so the after-row
-- events the write queued at the call's trigger query level are never
-- fired nor moved to the deferred list.  Here idem_keys_claim_finished is
-- lost and an in-transaction claim left unfinished COMMITS (pending for
-- good, in_transaction), and an ordinary AFTER INSERT trigger never fires.
-- 0.3.0 refused the commit (IL002) and fired the trigger.

CREATE TABLE public.inner_subxact_fired (what text);
CREATE FUNCTION public.before_insert_swallows_error() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    BEGIN
        PERFORM 1 / 0;              -- e.g. a best-effort side effect that failed
    EXCEPTION WHEN division_by_zero THEN
        NULL;
    END;
    RETURN NEW;
END $$;
CREATE TRIGGER before_insert_swallows_error BEFORE INSERT ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.before_insert_swallows_error();
CREATE FUNCTION public.after_insert_records() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO public.inner_subxact_fired VALUES (TG_NAME || ' ' || TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER after_insert_records AFTER INSERT ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.after_insert_records();

-- An in-transaction claim that is never finished must not commit.
BEGIN;
SELECT outcome FROM idem_begin(idem_key('inner_subxact', 'POST', '/subxact', 'k1'), idem_request_hash('x'));
SELECT what FROM public.inner_subxact_fired;
COMMIT;
SELECT count(*) AS committed_unfinished_claims
  FROM idem_keys WHERE cache_key = idem_key('inner_subxact', 'POST', '/subxact', 'k1');

DROP TRIGGER before_insert_swallows_error ON idem_keys;
DROP TRIGGER after_insert_records ON idem_keys;
DROP FUNCTION public.before_insert_swallows_error();
DROP FUNCTION public.after_insert_records();
DROP TABLE public.inner_subxact_fired;
DELETE FROM idem_keys WHERE cache_key = idem_key('inner_subxact', 'POST', '/subxact', 'k1');
