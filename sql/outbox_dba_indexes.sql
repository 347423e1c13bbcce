-- A DBA's indexes on the outbox's tables.  The claim (0.5.0's direct path)
-- scans two indexes of each by name: idem_outbox_claimable, the events in
-- claim order, and idem_outbox_key_order, the per-key order probe, and
-- idem_outbox_claimed_claimable and idem_outbox_claimed_key_order, the
-- same on idem_outbox_claimed.  Dropped,
-- renamed, invalid, of another kind or shape, descending, or re-created by
-- hand with a narrower predicate, either is refused with 55000 by the claim
-- that needs it; never scanned for a wrong answer.  (0.5.0 scanned a
-- narrower one: a key_order index that left out leased events let the
-- claim hand out a key's second event while its first was leased.)  A
-- broader predicate, or none, answers as pg_idem's own.  REINDEX is
-- harmless; an extra expression index runs as the tables' owner, and a
-- pg_idem call inside it acts in the owner's scope, not the client's.
-- Rows with NULLs where the columns are NOT NULL (a DBA who dropped that)
-- are claimed, acked and nacked by nobody (0.5.0 crashed on a NULL state).
--
-- Each change is made in a transaction that rolls back.
CREATE ROLE ob_dba_client LOGIN IN ROLE idem_client;
-- The shared scope's pending events (other tests'), parked meanwhile.
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
UPDATE idem_outbox_claimed SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE claimed (payload jsonb, token uuid, id bigint);
GRANT ALL ON claimed TO ob_dba_client;
-- The client's claim, in claim order of payloads.
CREATE FUNCTION pg_temp.claim() RETURNS SETOF jsonb
LANGUAGE sql AS $$
  WITH c AS (INSERT INTO claimed SELECT payload, claim_token, id FROM idem_outbox_claim(10)
             RETURNING payload, id)
  SELECT payload FROM c ORDER BY id
$$;

SET ROLE ob_dba_client;
SELECT idem_outbox_stage('ob.dba', '{"n": 1}'::jsonb, 'ob-dba-key') > 0 AS first_of_key,
       idem_outbox_stage('ob.dba', '{"n": 2}'::jsonb, 'ob-dba-key') > 0 AS second_of_key,
       idem_outbox_stage('ob.dba', '{"n": 3}'::jsonb) > 0 AS keyless;
RESET ROLE;

-- pg_idem's own indexes: the key's first event and the keyless one; the
-- second waits for the first.
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
SELECT * FROM pg_temp.claim();
ROLLBACK;

--
-- Refused, 55000.
--
-- Dropped.
BEGIN;
DROP INDEX idem_outbox_claimable;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Renamed: the per-key probe is needed by the keyed events.
BEGIN;
ALTER INDEX idem_outbox_key_order RENAME TO ob_dba_renamed;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Invalid (what a failed CREATE INDEX CONCURRENTLY leaves).
BEGIN;
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'idem_outbox_claimable'::regclass;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Re-created with a narrower predicate: leaving out the leased events.
-- The first claim leased the key's head, which that index leaves out, and
-- 0.5.0's second claim handed out the key's second event.
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP INDEX idem_outbox_key_order;
CREATE INDEX idem_outbox_key_order ON idem_outbox_queue (key_hash, id)
    WHERE state = 'pending' AND key_hash IS NOT NULL AND attempts = 0;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- The same on idem_outbox_claimed, where the leased head is: an index that
-- leaves out the leased events would let the key's second event go.
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
DROP INDEX idem_outbox_claimed_key_order;
CREATE INDEX idem_outbox_claimed_key_order ON idem_outbox_claimed (key_hash, id)
    WHERE state = 'pending' AND key_hash IS NOT NULL AND claim_token IS NULL;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
BEGIN;
DROP INDEX idem_outbox_claimed_claimable;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- ... or some topics: their events would never be claimed.
BEGIN;
DROP INDEX idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue (scope, available_at, id)
    WHERE state = 'pending' AND topic <> 'ob.dba';
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Descending: claims would take the latest due events first.
BEGIN;
DROP INDEX idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue (scope, available_at DESC, id)
    WHERE state = 'pending';
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Another kind of index, or other columns, or an expression.
BEGIN;
DROP INDEX idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue USING hash (scope) WHERE state = 'pending';
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
BEGIN;
DROP INDEX idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue (scope, id, available_at) WHERE state = 'pending';
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
BEGIN;
DROP INDEX idem_outbox_key_order;
CREATE INDEX idem_outbox_key_order ON idem_outbox_queue (sha256(key_hash), id) WHERE state = 'pending';
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- Ack and nack do not scan them: a missing one does not stop a drainer
-- from settling what it holds.
BEGIN;
SET ROLE ob_dba_client;
SELECT count(*) AS claimed FROM pg_temp.claim();
RESET ROLE;
DROP INDEX idem_outbox_claimable;
DROP INDEX idem_outbox_key_order;
SET ROLE ob_dba_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 3}';
ROLLBACK;
TRUNCATE claimed;

--
-- Accepted: broader predicates, or none, give pg_idem's answer.
--
BEGIN;
DROP INDEX idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue (scope, available_at, id);
DROP INDEX idem_outbox_key_order;
CREATE INDEX idem_outbox_key_order ON idem_outbox_queue (key_hash, id)
    WHERE key_hash IS NOT NULL AND state IN ('pending', 'dead');
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
SELECT * FROM pg_temp.claim();
ROLLBACK;
-- REINDEX (also inside the transaction that claims).
BEGIN;
REINDEX INDEX idem_outbox_claimable;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
REINDEX INDEX idem_outbox_key_order;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
REINDEX INDEX CONCURRENTLY idem_outbox_key_order;
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
ROLLBACK;
TRUNCATE claimed;

--
-- An extra expression index: its function runs as the table's owner (as
-- every write of pg_idem's does), and a pg_idem call inside it acts in
-- that role's scope, not the client's: it cannot ack the client's event,
-- even with the client's token.
--
CREATE FUNCTION public.ob_dba_index_probe(id bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n integer;
BEGIN
  IF pg_catalog.current_setting('ob_dba.probe', true) = 'on' THEN
    -- claimed: the client's tokens (pg_temp is on the pinned search_path).
    SELECT public.idem_outbox_ack(c.token, ARRAY[c.id]) INTO n
      FROM claimed c WHERE c.payload = '{"n": 3}';
    RAISE NOTICE 'inside the index: as the table''s owner: %, acked with the client''s token: %',
      current_user = (SELECT relowner::regrole::name FROM pg_catalog.pg_class
                       WHERE oid = 'public.idem_outbox_claimed'::pg_catalog.regclass), n;
  END IF;
  RETURN id;
END $$;
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
CREATE INDEX ob_dba_probe ON idem_outbox_claimed (public.ob_dba_index_probe(id));
SET ob_dba.probe = 'on';
SET ROLE ob_dba_client;
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'no broker') n
 WHERE c.payload = '{"n": 1}';
RESET ROLE;
RESET ob_dba.probe;
SELECT payload, attempts, claim_token IS NOT NULL AS leased FROM idem_outbox
 WHERE topic = 'ob.dba' ORDER BY id;
ROLLBACK;
DROP FUNCTION public.ob_dba_index_probe(bigint);
TRUNCATE claimed;

--
-- NULLs in NOT NULL columns, after a DBA dropped the constraints and
-- edited rows by hand, with indexes of no predicate (which are accepted):
-- no claim takes such a row, and no token acks or nacks it.
--
BEGIN;
SET ROLE ob_dba_client;
SELECT * FROM pg_temp.claim();
RESET ROLE;
ALTER TABLE idem_outbox_claimed ALTER COLUMN state DROP NOT NULL,
                                ALTER COLUMN scope DROP NOT NULL,
                                ALTER COLUMN available_at DROP NOT NULL;
DROP INDEX idem_outbox_claimed_claimable;
CREATE INDEX idem_outbox_claimed_claimable ON idem_outbox_claimed (scope, available_at, id);
DROP INDEX idem_outbox_claimed_key_order;
CREATE INDEX idem_outbox_claimed_key_order ON idem_outbox_claimed (key_hash, id);
-- The key's head without a state, the keyless one without a due time
-- (both leased, so in idem_outbox_claimed), and the key's second event
-- due now.
UPDATE idem_outbox_claimed SET state = NULL, available_at = clock_timestamp()
 WHERE topic = 'ob.dba' AND payload = '{"n": 1}';
UPDATE idem_outbox_claimed SET state = NULL, available_at = NULL
 WHERE topic = 'ob.dba' AND payload = '{"n": 3}';
SET ROLE ob_dba_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'x') n
 WHERE c.payload = '{"n": 3}';
SELECT * FROM pg_temp.claim();
RESET ROLE;
-- Without a scope, the head is nobody's (not the shared scope's).
UPDATE idem_outbox_claimed SET state = 'pending', scope = NULL
 WHERE topic = 'ob.dba' AND payload = '{"n": 1}';
SET ROLE ob_dba_client;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM claimed WHERE payload = '{"n": 1}';
RESET ROLE;
SELECT payload, state, scope IS NULL AS no_scope FROM idem_outbox
 WHERE topic = 'ob.dba' ORDER BY id;
ROLLBACK;

-- As found.
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) LIKE '%WHERE%' AS partial,
       indisvalid
  FROM pg_index WHERE indrelid IN ('idem_outbox_queue'::regclass, 'idem_outbox_claimed'::regclass)
 ORDER BY indexrelid::regclass::text;
DELETE FROM idem_outbox WHERE topic = 'ob.dba';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
UPDATE idem_outbox_claimed q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE claimed;
DROP ROLE ob_dba_client;
