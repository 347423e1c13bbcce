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

CREATE TABLE public.review13_fired (what text);
CREATE FUNCTION public.review13_before() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    BEGIN
        PERFORM 1 / 0;              -- e.g. a best-effort side effect that failed
    EXCEPTION WHEN division_by_zero THEN
        NULL;
    END;
    RETURN NEW;
END $$;
CREATE TRIGGER review13_before BEFORE INSERT ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.review13_before();
CREATE FUNCTION public.review13_after() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO public.review13_fired VALUES (TG_NAME || ' ' || TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER review13_after AFTER INSERT ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.review13_after();

-- An in-transaction claim that is never finished must not commit.
BEGIN;
SELECT outcome FROM idem_begin(idem_key('review13', 'POST', '/subxact', 'k1'), idem_request_hash('x'));
SELECT what FROM public.review13_fired;
COMMIT;
SELECT count(*) AS committed_unfinished_claims
  FROM idem_keys WHERE cache_key = idem_key('review13', 'POST', '/subxact', 'k1');

DROP TRIGGER review13_before ON idem_keys;
DROP TRIGGER review13_after ON idem_keys;
DROP FUNCTION public.review13_before();
DROP FUNCTION public.review13_after();
DROP TABLE public.review13_fired;
DELETE FROM idem_keys WHERE cache_key = idem_key('review13', 'POST', '/subxact', 'k1');
