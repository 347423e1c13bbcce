-- The drainer's functions inside transactions, savepoints, cursors and
-- per-row calls (0.5.0's direct path keeps per-backend state across calls,
-- and reads with the statement's or a fresh snapshot): a lease never
-- survives the (sub)transaction that rolls it back, an error inside a call
-- leaves the next call working, and no event is handed out twice or lost
-- however the calls are nested in a statement.
CREATE ROLE ob_tx_client LOGIN IN ROLE idem_client;
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox_queue WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE got (how text, payload jsonb, token uuid, id bigint);
GRANT ALL ON got TO ob_tx_client;
-- The queue as the oracle sees it; and every event due again, unleased.
CREATE FUNCTION pg_temp.queue() RETURNS TABLE (payload jsonb, attempts integer, leased boolean)
LANGUAGE sql AS $$
  SELECT payload, attempts, claim_token IS NOT NULL FROM idem_outbox
   WHERE topic = 'ob.tx' AND state <> 'published' ORDER BY id
$$;
CREATE FUNCTION pg_temp.release() RETURNS void
LANGUAGE sql AS $$
  UPDATE idem_outbox_claimed SET available_at = clock_timestamp(), claim_token = NULL
   WHERE topic = 'ob.tx' AND state <> 'published'
$$;

SET ROLE ob_tx_client;
SELECT count(*) AS staged FROM idem_outbox_stage_batch('ob.tx',
         ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[],
         ARRAY[NULL, 'ob-tx-key', 'ob-tx-key', NULL]);
RESET ROLE;

--
-- Rollbacks.
--
SET ROLE ob_tx_client;
BEGIN;
SELECT payload FROM idem_outbox_claim(10) ORDER BY id;
ROLLBACK;
-- In a savepoint rolled back; the same transaction claims them again.
BEGIN;
SAVEPOINT s;
SELECT count(*) AS claimed FROM idem_outbox_claim(10);
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS claimed_again FROM idem_outbox_claim(10);
ROLLBACK;
-- In a PL/pgSQL block whose exception undoes it.
DO $$
DECLARE
  n integer;
BEGIN
  BEGIN
    SELECT count(*) INTO n FROM idem_outbox_claim(10);
    RAISE NOTICE 'claimed % in the block', n;
    PERFORM 1 / 0;
  EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'block undone';
  END;
  SELECT count(*) INTO n FROM idem_outbox_claim(10);
  RAISE NOTICE 'claimed % after it', n;
  RAISE EXCEPTION 'and the whole call undone';
END $$;
RESET ROLE;
SELECT * FROM pg_temp.queue();

-- An error inside a call (here a trigger refusing the lease, after the row
-- was locked: the first lease inserts the event into idem_outbox_claimed,
-- a later one updates it there), in a savepoint: the next call in the same
-- transaction works.
CREATE FUNCTION public.ob_tx_refuse() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.payload = '{"n": 4}' THEN
    RAISE EXCEPTION 'refused by the trigger';
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER ob_tx_refuse AFTER INSERT OR UPDATE ON idem_outbox_claimed
    FOR EACH ROW EXECUTE FUNCTION public.ob_tx_refuse();
SET ROLE ob_tx_client;
BEGIN;
SAVEPOINT s;
SELECT count(*) FROM idem_outbox_claim(10);
ROLLBACK TO SAVEPOINT s;
SELECT payload FROM idem_outbox_claim(2) ORDER BY id;
COMMIT;
RESET ROLE;
DROP TRIGGER ob_tx_refuse ON idem_outbox_claimed;
DROP FUNCTION public.ob_tx_refuse();
SELECT * FROM pg_temp.queue();
SELECT pg_temp.release();

--
-- Isolation levels: under REPEATABLE READ and SERIALIZABLE a transaction's
-- second claim sees its first one's leases (the concurrent cases are in
-- tests/isolation/specs/outbox_claim_skips.spec), and acks its own.
--
SET ROLE ob_tx_client;
BEGIN ISOLATION LEVEL REPEATABLE READ;
INSERT INTO got SELECT 'rr', payload, claim_token, id FROM idem_outbox_claim(1);
INSERT INTO got SELECT 'rr', payload, claim_token, id FROM idem_outbox_claim(10);
SELECT payload FROM got ORDER BY id;
SELECT sum(idem_outbox_ack(token, ARRAY[id])) AS acked FROM got WHERE payload = '{"n": 1}';
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT payload FROM idem_outbox_claim(10) ORDER BY id;
SELECT count(*) AS claimed_again FROM idem_outbox_claim(10);
COMMIT;
-- Read-only: refused before anything is read.
BEGIN READ ONLY;
SELECT count(*) FROM idem_outbox_claim(10);
ROLLBACK;
RESET ROLE;
SELECT * FROM pg_temp.queue();
SELECT pg_temp.release();
TRUNCATE got;

--
-- Cursors: the claim runs once, at the first fetch; scrolling back and
-- rescanning return the same rows and lease nothing more.  A WITH HOLD
-- cursor's rows outlive the claim's commit.
--
SET ROLE ob_tx_client;
DO $$
DECLARE
  c refcursor;
  first record;
  r record;
BEGIN
  OPEN c SCROLL FOR SELECT payload, claim_token, id FROM idem_outbox_claim(10) ORDER BY id;
  FETCH c INTO first;
  RAISE NOTICE 'first: %', first.payload;
  -- An ack in between, with the fetched row's token; nothing left to claim.
  RAISE NOTICE 'acked: %, then claimable: %', idem_outbox_ack(first.claim_token, ARRAY[first.id]),
    (SELECT count(*) FROM idem_outbox_claim(10));
  LOOP
    FETCH c INTO r;
    EXIT WHEN NOT FOUND;
    RAISE NOTICE 'then: %, of the same claim: %', r.payload, r.claim_token = first.claim_token;
  END LOOP;
  MOVE ABSOLUTE 0 FROM c;
  LOOP
    FETCH c INTO r;
    EXIT WHEN NOT FOUND;
    RAISE NOTICE 'rescanned: %, of the same claim: %', r.payload, r.claim_token = first.claim_token;
  END LOOP;
END $$;
RESET ROLE;
SELECT * FROM pg_temp.queue();
SELECT pg_temp.release();
SET ROLE ob_tx_client;
BEGIN;
DECLARE h CURSOR WITH HOLD FOR SELECT payload, claim_token IS NOT NULL AS leased
                                FROM idem_outbox_claim(10) ORDER BY id;
COMMIT;
FETCH ALL FROM h;
CLOSE h;
RESET ROLE;
SELECT * FROM pg_temp.queue();
SELECT pg_temp.release();

--
-- Per-row calls: claims in a target list, in a LATERAL join with a batch
-- that changes per row, a claim and its acks in one statement, a claim per
-- row of a SQL function: each call its own token, no event twice.
--
SET ROLE ob_tx_client;
SELECT count(*) AS staged FROM idem_outbox_stage_batch('ob.tx',
         ARRAY['{"n": 5}', '{"n": 6}', '{"n": 7}']::jsonb[]);
BEGIN;
INSERT INTO got SELECT 'target list', (c).payload, (c).claim_token, (c).id
  FROM (SELECT idem_outbox_claim(1) AS c FROM generate_series(1, 3)) s;
INSERT INTO got SELECT 'lateral', c.payload, c.claim_token, c.id
  FROM generate_series(1, 2) g, LATERAL idem_outbox_claim(g) c;
SELECT how, payload FROM got ORDER BY id;
SELECT count(DISTINCT token) AS tokens, count(*) AS events, count(DISTINCT id) AS distinct_events
  FROM got;
ROLLBACK;
TRUNCATE got;
SELECT c.payload, idem_outbox_ack(c.claim_token, ARRAY[c.id]) AS acked
  FROM idem_outbox_claim(10) c ORDER BY c.id;
CREATE FUNCTION pg_temp.claim_one() RETURNS jsonb
LANGUAGE sql AS $$ SELECT payload FROM idem_outbox_claim(1) $$;
SELECT g, pg_temp.claim_one() AS payload FROM generate_series(1, 3) g;
RESET ROLE;
SELECT payload, state, attempts FROM idem_outbox WHERE topic = 'ob.tx' ORDER BY id;

DELETE FROM idem_outbox WHERE topic = 'ob.tx';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE got;
DROP FUNCTION pg_temp.claim_one();
DROP ROLE ob_tx_client;
