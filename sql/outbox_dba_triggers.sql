-- A DBA's triggers and rules on the outbox's tables, under 0.5.0's direct
-- claim, ack and nack (no SQL statement runs them): each is honoured as
-- the SQL statements of 0.4.0 honoured it, or refused with 0A000; never
-- silently skipped, and never an event lost or handed out twice.
--  * AFTER row triggers fire for every write: a first lease moves the
--    event (DELETE from the queue, INSERT into idem_outbox_claimed), a
--    later lease, a nack and an ack update it in idem_outbox_claimed
--    (with the changed columns: UPDATE OF claim_token fires for a lease);
--    statement triggers fire once per call that writes;
--  * a BEFORE row trigger (the queue's DELETE, idem_outbox_claimed's
--    UPDATE, enabled or not) and a rule are refused: they could change or
--    keep a row after pg_idem decided on it, and nothing is leased or
--    published then;
--  * idem_outbox_claimed's BEFORE INSERT trigger may change the row a
--    first lease moves there, and one that fails (or skips the row) fails
--    the claim: the event stays in the queue, and a later claim takes it.
-- Trigger functions run as the queue's owner, as pg_idem's writes do.
CREATE ROLE ob_trg_client LOGIN IN ROLE idem_client;
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox_queue WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE claimed (payload jsonb, token uuid, id bigint);
GRANT ALL ON claimed TO ob_trg_client;
CREATE FUNCTION pg_temp.claim() RETURNS SETOF jsonb
LANGUAGE sql AS $$
  WITH c AS (INSERT INTO claimed SELECT payload, claim_token, id FROM idem_outbox_claim(10)
             RETURNING payload, id)
  SELECT payload FROM c ORDER BY id
$$;

-- pid: the backend whose statement fired the trigger.  The cleanup worker's
-- outbox prune is a DELETE statement too, and its statement triggers fire
-- whenever a pass runs during the test: only this session's are the test's.
CREATE TABLE public.ob_trg_log (seq serial, what text, payload jsonb, as_owner boolean,
                                pid integer DEFAULT pg_catalog.pg_backend_pid());
CREATE FUNCTION public.ob_trg_note() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
  INSERT INTO public.ob_trg_log (what, payload, as_owner)
  VALUES (TG_TABLE_NAME || ' ' || TG_WHEN || ' ' || TG_LEVEL || ' ' || TG_OP,
          CASE WHEN TG_LEVEL = 'ROW' THEN
            (CASE WHEN TG_OP = 'DELETE' THEN OLD.payload ELSE NEW.payload END) END,
          current_user = (SELECT relowner::regrole::name FROM pg_class
                           WHERE oid = TG_RELID));
  RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
-- What the log says, then empty it.
CREATE FUNCTION pg_temp.log() RETURNS TABLE (what text, payload jsonb, as_owner boolean)
LANGUAGE sql AS $$
  WITH l AS (DELETE FROM public.ob_trg_log RETURNING *)
  SELECT what, payload, as_owner FROM l WHERE pid = pg_catalog.pg_backend_pid() ORDER BY seq
$$;

SET ROLE ob_trg_client;
SELECT idem_outbox_stage('ob.trg', '{"n": 1}'::jsonb) > 0 AS first,
       idem_outbox_stage('ob.trg', '{"n": 2}'::jsonb) > 0 AS second;
RESET ROLE;

--
-- AFTER triggers and statement triggers: honoured.
--
CREATE TRIGGER ob_trg_moved AFTER DELETE ON idem_outbox_queue
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_lease AFTER INSERT OR UPDATE OF claim_token ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_ack AFTER UPDATE OF state ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_before_stmt BEFORE UPDATE OR DELETE ON idem_outbox_queue
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_after_stmt AFTER UPDATE OR DELETE ON idem_outbox_queue
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_claimed_before_stmt BEFORE INSERT OR UPDATE OR DELETE ON idem_outbox_claimed
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_claimed_after_stmt AFTER INSERT OR UPDATE OR DELETE ON idem_outbox_claimed
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
SELECT * FROM pg_temp.log();
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 2}';
-- A stale ack and a stale nack write nothing, and fire nothing.
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 2}';
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 2}';
-- A claim that finds nothing writes nothing.
SELECT count(*) AS claimed FROM idem_outbox_claim(10);
RESET ROLE;
SELECT * FROM pg_temp.log();
DROP TRIGGER ob_trg_moved ON idem_outbox_queue;
DROP TRIGGER ob_trg_lease ON idem_outbox_claimed;
DROP TRIGGER ob_trg_ack ON idem_outbox_claimed;
DROP TRIGGER ob_trg_before_stmt ON idem_outbox_queue;
DROP TRIGGER ob_trg_after_stmt ON idem_outbox_queue;
DROP TRIGGER ob_trg_claimed_before_stmt ON idem_outbox_claimed;
DROP TRIGGER ob_trg_claimed_after_stmt ON idem_outbox_claimed;
TRUNCATE claimed;
UPDATE idem_outbox_claimed SET available_at = clock_timestamp() WHERE topic = 'ob.trg';

--
-- BEFORE row triggers on the queue, and rules: refused, nothing written.
--
CREATE TRIGGER ob_trg_before_update BEFORE UPDATE ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
-- Disabled, it is refused all the same (it could be enabled at any time).
ALTER TABLE idem_outbox_claimed DISABLE TRIGGER ob_trg_before_update;
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP TRIGGER ob_trg_before_update ON idem_outbox_claimed;
SELECT payload, attempts, claim_token IS NULL AS unclaimed FROM idem_outbox_claimed
 WHERE topic = 'ob.trg' AND state = 'pending';
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
CREATE TRIGGER ob_trg_before_update BEFORE UPDATE ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n;
RESET ROLE;
DROP TRIGGER ob_trg_before_update ON idem_outbox_claimed;
CREATE TRIGGER ob_trg_before_update BEFORE UPDATE ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed;
RESET ROLE;
DROP TRIGGER ob_trg_before_update ON idem_outbox_claimed;
CREATE RULE ob_trg_rule AS ON UPDATE TO idem_outbox_claimed
    DO ALSO INSERT INTO public.ob_trg_log (what) VALUES ('rule');
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed;
RESET ROLE;
DROP RULE ob_trg_rule ON idem_outbox_claimed;
-- Still held by its claim, unpublished.
SELECT payload, state, claim_token = c.token AS held FROM idem_outbox o JOIN claimed c USING (payload)
 WHERE o.topic = 'ob.trg';
SELECT * FROM pg_temp.log();

-- Published by a plain ack, now that nothing refuses it.
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed;
RESET ROLE;
TRUNCATE claimed;

--
-- idem_outbox_claimed's BEFORE INSERT triggers (a first lease): honoured;
-- a failing one fails the claim, and the event stays in the queue,
-- unclaimed, for the next claim.
--
SET ROLE ob_trg_client;
SELECT idem_outbox_stage('ob.trg', '{"n": 3}'::jsonb) > 0 AS third;
RESET ROLE;
CREATE FUNCTION public.ob_trg_claimed_fails() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'claim refused by its trigger';
END $$;
CREATE TRIGGER ob_trg_claimed_fails BEFORE INSERT ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_claimed_fails();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
SELECT payload, state, attempts, claim_token IS NULL AS unclaimed FROM idem_outbox_queue
 WHERE topic = 'ob.trg';
DROP TRIGGER ob_trg_claimed_fails ON idem_outbox_claimed;
CREATE FUNCTION public.ob_trg_claimed_scrub() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.headers := '{"scrubbed": true}';
  RETURN NEW;
END $$;
CREATE TRIGGER ob_trg_claimed_scrub BEFORE INSERT ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_claimed_scrub();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed;
RESET ROLE;
SELECT payload, headers, state FROM idem_outbox WHERE topic = 'ob.trg' ORDER BY id;
DROP TRIGGER ob_trg_claimed_scrub ON idem_outbox_claimed;

DROP FUNCTION public.ob_trg_claimed_fails();
DROP FUNCTION public.ob_trg_claimed_scrub();
DROP FUNCTION public.ob_trg_note();
DROP TABLE public.ob_trg_log;
DELETE FROM idem_outbox WHERE topic = 'ob.trg';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE claimed;
DROP ROLE ob_trg_client;
