-- Pins a fix from the review of the direct path (keys/key_table.c): with any AFTER ROW trigger on
-- idem_keys that is not deferred, every call's AfterTriggerEndQuery (in
-- key_table_close) asks ExecGetTriggerResultRel for idem_keys; the kept
-- EState has no es_opened_result_relations, so each call makes a new
-- ResultRelInfo (TriggerDesc copy, FmgrInfo array, trigger slots in
-- es_tupleTable) in es_query_cxt, which lives as long as the backend: about
-- 3 kB per call, 600 MB per 200k renews.  0.3.0 freed its executor per call.

CREATE FUNCTION public.noop_after_update() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER noop_after_update AFTER UPDATE ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.noop_after_update();

SELECT claim_id AS c FROM idem_claim(idem_key('trigger_memory', 'POST', '/mem', 'k1'),
                                     idem_request_hash('x'), '1 hour') \gset
CREATE FUNCTION pg_temp.renew_times(n int, k bytea, c uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        PERFORM idem_renew(k, c, '1 hour');
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.backend_bytes() RETURNS bigint LANGUAGE sql AS $$
    SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts $$;

-- warm up, then 5000 renews
SELECT pg_temp.renew_times(100, idem_key('trigger_memory', 'POST', '/mem', 'k1'), :'c');
SELECT pg_temp.backend_bytes() AS before \gset
SELECT pg_temp.renew_times(5000, idem_key('trigger_memory', 'POST', '/mem', 'k1'), :'c');
SELECT pg_temp.backend_bytes() - :before < 1024 * 1024 AS grew_less_than_1mb;

DROP TRIGGER noop_after_update ON idem_keys;
DROP FUNCTION public.noop_after_update();
SELECT idem_release(idem_key('trigger_memory', 'POST', '/mem', 'k1'), :'c') AS released;
DELETE FROM idem_keys WHERE cache_key = idem_key('trigger_memory', 'POST', '/mem', 'k1');
