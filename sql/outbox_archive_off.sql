-- idem.outbox_archive = off: nothing is kept after the ack, so nothing
-- moves to idem_outbox_claimed: a claim leases the event in place in the
-- queue and the ack deletes it there, as up to 0.5.0.  Drainers of both
-- settings may share one outbox: an event stays where its claim put it,
-- and acks, nacks, re-claims, the per-key order and the prune find it in
-- either table.
CREATE ROLE ob_off LOGIN IN ROLE idem_client;
-- The shared scope's pending events (other tests'), parked meanwhile.
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
UPDATE idem_outbox_claimed SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE got (name text, token uuid, id bigint);
GRANT ALL ON got TO ob_off;
-- Claim up to n as ob_off, keeping the tokens; the names claimed.
CREATE FUNCTION pg_temp.claim(n integer) RETURNS SETOF text
LANGUAGE sql AS $$
  WITH c AS (INSERT INTO got SELECT payload->>'name', claim_token, id FROM idem_outbox_claim(n)
             RETURNING name, id)
  SELECT name FROM c ORDER BY id
$$;
-- Where each event is.
CREATE FUNCTION pg_temp.events() RETURNS TABLE (name text, in_table text, state text,
                                                  attempts integer, leased boolean)
LANGUAGE sql AS $$
  SELECT payload->>'name', 'queue', state, attempts, state = 'pending' AND claim_token IS NOT NULL
    FROM idem_outbox_queue WHERE topic = 'ob.off'
  UNION ALL
  SELECT payload->>'name', 'claimed', state, attempts, state = 'pending' AND claim_token IS NOT NULL
    FROM idem_outbox_claimed WHERE topic = 'ob.off'
  ORDER BY 1
$$;

SET ROLE ob_off;
SELECT count(idem_outbox_stage('ob.off', jsonb_build_object('name', n))) AS staged
  FROM unnest(ARRAY['a', 'b', 'c', 'd']) n;
SELECT idem_outbox_stage('ob.off', '{"name": "k1"}'::jsonb, 'ob-off-key') > 0 AS k1,
       idem_outbox_stage('ob.off', '{"name": "k2"}'::jsonb, 'ob-off-key') > 0 AS k2;
RESET ROLE;

-- The archive off: leased in place (the key's second event waits).
SET idem.outbox_archive = off;
SET ROLE ob_off;
SELECT * FROM pg_temp.claim(3);
RESET ROLE;
SELECT * FROM pg_temp.events();
-- The archive on (another drainer): it moves what it claims; the key's
-- second event waits for its head, moved by the same claim ...
RESET idem.outbox_archive;
SET ROLE ob_off;
SELECT * FROM pg_temp.claim(10);
-- ... and by the next one, which finds the head in idem_outbox_claimed.
SELECT * FROM pg_temp.claim(10);
RESET ROLE;
SELECT * FROM pg_temp.events();

-- Acks and nacks find the event where it is, whatever the setting: an
-- ack with the archive on marks a queue-leased event published in place,
-- one with it off deletes a moved event, a nack backs off in place.
SET ROLE ob_off;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked_on FROM got WHERE name = 'a';
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked_on FROM got WHERE name = 'k1';
RESET ROLE;
SET idem.outbox_archive = off;
SET ROLE ob_off;
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked_off FROM got WHERE name = 'd';
SELECT (idem_outbox_nack(token, id, 'no broker')).outcome AS nacked FROM got WHERE name = 'b';
-- Stale, twice over: published, and deleted.
SELECT sum(idem_outbox_ack(token, ARRAY[id])) AS acked_again FROM got WHERE name IN ('a', 'd');
RESET ROLE;
RESET idem.outbox_archive;
SELECT * FROM pg_temp.events();

-- The key's head is published: its second event goes (and moves).
SET ROLE ob_off;
SELECT * FROM pg_temp.claim(10);
RESET ROLE;
-- A re-claim of the queue-leased event, after its backoff, moves it.
UPDATE idem_outbox_queue SET available_at = clock_timestamp() WHERE topic = 'ob.off'
   AND payload->>'name' = 'b';
SET ROLE ob_off;
SELECT * FROM pg_temp.claim(10);
RESET ROLE;
SELECT * FROM pg_temp.events();

DELETE FROM idem_outbox WHERE topic = 'ob.off';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
UPDATE idem_outbox_claimed q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE got;
DROP ROLE ob_off;
