-- Pins a fix from the review of the direct path (keys/key_table.c): the direct writes do not fire the
-- triggers an UPDATE of idem_keys fires.  The kept range table entry has
-- no updatedCols, so ExecARUpdateTriggers passes an empty set of modified
-- columns and an AFTER UPDATE OF <column> trigger never fires (the same
-- empty set tells index_unchanged_by_update that no index column changed);
-- statement-level triggers (ExecBS*/ExecAS*) are never called.  0.3.0's
-- UPDATE fired both.

CREATE TABLE public.update_trigger_events (what text);
CREATE FUNCTION public.log_trigger_name() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO public.update_trigger_events VALUES (TG_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER state_changed AFTER UPDATE OF state ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.log_trigger_name();
CREATE TRIGGER per_statement_update AFTER UPDATE ON idem_keys
    FOR EACH STATEMENT EXECUTE FUNCTION public.log_trigger_name();

SELECT claim_id AS c FROM idem_claim(idem_key('trigger_events', 'POST', '/ev', 'k1'),
                                     idem_request_hash('x'), '1 hour') \gset
SELECT idem_finalize(idem_key('trigger_events', 'POST', '/ev', 'k1'), :'c', 200, NULL, 'ok'::bytea) AS finalized;
SELECT bool_or(what = 'state_changed') AS update_of_state_fired,
       bool_or(what = 'per_statement_update') AS statement_trigger_fired
  FROM public.update_trigger_events;

DROP TRIGGER state_changed ON idem_keys;
DROP TRIGGER per_statement_update ON idem_keys;
DROP FUNCTION public.log_trigger_name();
DROP TABLE public.update_trigger_events;
DELETE FROM idem_keys WHERE cache_key = idem_key('trigger_events', 'POST', '/ev', 'k1');
