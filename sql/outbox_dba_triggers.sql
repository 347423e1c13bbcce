-- A DBA's triggers and rules on the outbox's tables, under 0.5.0's direct
-- claim, ack and nack (no SQL statement runs them): each is honoured as
-- the SQL statements of 0.4.0 honoured it, or refused with 0A000; never
-- silently skipped, and never an event lost or handed out twice.
--  * AFTER row triggers fire for every write: a first claim moves the
--    event (DELETE on the queue, INSERT on idem_outbox_claimed), an ack
--    and a nack update it in idem_outbox_claimed (UPDATE OF claim_token
--    fires for the nack, which clears the token, not for the ack, which
--    keeps it); statement triggers fire once per call that writes;
--  * a BEFORE UPDATE or BEFORE DELETE row trigger (enabled or not) and a
--    rule are refused: they could change or keep a row after pg_idem
--    decided on it, and nothing is leased or published then;
--  * idem_outbox_claimed's BEFORE INSERT trigger may change the row the
--    claim moves, as a trigger may any INSERT; one that fails fails the
--    claim, and one that skips the row is refused (the event would be
--    lost): the event stays in the queue, unclaimed.
-- Trigger functions run as the tables' owner, as pg_idem's writes do.
CREATE ROLE ob_trg_client LOGIN IN ROLE idem_client;
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
UPDATE idem_outbox_claimed SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
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
CREATE TRIGGER ob_trg_moved_out AFTER DELETE ON idem_outbox_queue
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_moved_in AFTER INSERT ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_token AFTER UPDATE OF claim_token ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_queue_stmt BEFORE DELETE ON idem_outbox_queue
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
CREATE TRIGGER ob_trg_claimed_stmt AFTER INSERT OR UPDATE ON idem_outbox_claimed
    FOR EACH STATEMENT EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
SELECT * FROM pg_temp.log();
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
RESET ROLE;
SELECT * FROM pg_temp.log();
SET ROLE ob_trg_client;
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 2}';
-- A stale ack and a stale nack write nothing, and fire nothing.
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 2}';
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 2}';
-- A second ack of the published event neither.
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
-- A claim that finds nothing writes nothing.
SELECT count(*) AS claimed FROM idem_outbox_claim(10);
RESET ROLE;
SELECT * FROM pg_temp.log();
DROP TRIGGER ob_trg_moved_out ON idem_outbox_queue;
DROP TRIGGER ob_trg_moved_in ON idem_outbox_claimed;
DROP TRIGGER ob_trg_token ON idem_outbox_claimed;
DROP TRIGGER ob_trg_queue_stmt ON idem_outbox_queue;
DROP TRIGGER ob_trg_claimed_stmt ON idem_outbox_claimed;
TRUNCATE claimed;
DELETE FROM idem_outbox WHERE topic = 'ob.trg';
SET ROLE ob_trg_client;
SELECT idem_outbox_stage('ob.trg', '{"n": 3}'::jsonb) > 0 AS third;
RESET ROLE;

--
-- BEFORE UPDATE and BEFORE DELETE row triggers, and rules: refused,
-- nothing written.
--
-- The claim's move deletes from the queue.
CREATE TRIGGER ob_trg_before_delete BEFORE DELETE ON idem_outbox_queue
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
-- Disabled, it is refused all the same (it could be enabled at any time).
ALTER TABLE idem_outbox_queue DISABLE TRIGGER ob_trg_before_delete;
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP TRIGGER ob_trg_before_delete ON idem_outbox_queue;
CREATE RULE ob_trg_rule AS ON DELETE TO idem_outbox_queue
    DO ALSO INSERT INTO public.ob_trg_log (what) VALUES ('rule');
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP RULE ob_trg_rule ON idem_outbox_queue;
SELECT payload, attempts, claim_token IS NULL AS unclaimed FROM idem_outbox_queue
 WHERE topic = 'ob.trg';
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
-- The nack and the ack update idem_outbox_claimed.
CREATE TRIGGER ob_trg_before_update BEFORE UPDATE ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_note();
SET ROLE ob_trg_client;
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n;
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
SET ROLE ob_trg_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed;
RESET ROLE;
TRUNCATE claimed;

--
-- idem_outbox_claimed's BEFORE INSERT triggers: one that fails fails the
-- claim, one that skips the row is refused, one that changes it is
-- honoured; the event is never lost.
--
SET ROLE ob_trg_client;
SELECT idem_outbox_stage('ob.trg', '{"n": 4}'::jsonb) > 0 AS fourth;
RESET ROLE;
CREATE FUNCTION public.ob_trg_claimed_fails() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'move refused by its trigger';
END $$;
CREATE TRIGGER ob_trg_claimed_fails BEFORE INSERT ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_claimed_fails();
SET ROLE ob_trg_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP TRIGGER ob_trg_claimed_fails ON idem_outbox_claimed;
CREATE FUNCTION public.ob_trg_claimed_skips() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RETURN NULL;
END $$;
CREATE TRIGGER ob_trg_claimed_skips BEFORE INSERT ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_trg_claimed_skips();
SET ROLE ob_trg_client;
-- (Terse: the detail names the event's id, which other tests' events move.)
\set VERBOSITY terse
SELECT * FROM pg_temp.claim();
\set VERBOSITY default
RESET ROLE;
DROP TRIGGER ob_trg_claimed_skips ON idem_outbox_claimed;
SELECT payload, state, attempts FROM idem_outbox WHERE topic = 'ob.trg' ORDER BY id;
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
SELECT payload, headers, state, attempts FROM idem_outbox WHERE topic = 'ob.trg' ORDER BY id;
DROP TRIGGER ob_trg_claimed_scrub ON idem_outbox_claimed;

DROP FUNCTION public.ob_trg_claimed_fails();
DROP FUNCTION public.ob_trg_claimed_skips();
DROP FUNCTION public.ob_trg_claimed_scrub();
DROP FUNCTION public.ob_trg_note();
DROP TABLE public.ob_trg_log;
DELETE FROM idem_outbox WHERE topic = 'ob.trg';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
UPDATE idem_outbox_claimed q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE claimed;
DROP ROLE ob_trg_client;
