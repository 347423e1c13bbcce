-- The outbox per role (issue 12): a role's drainers claim only the events
-- its own stagers staged (and those of 0.2.0, scope 0); acks and nacks
-- are fenced by the claim token; per-key order is per (scope, key);
-- admins see everything; a client role sees its own backlog, without
-- payloads.  Also: batch staging, idem_outbox_stage_bytes, the archive
-- and idem.outbox_archive = off, hand edits through the idem_outbox view.
CREATE ROLE ob_svc_a LOGIN IN ROLE idem_client;
CREATE ROLE ob_svc_b LOGIN IN ROLE idem_client;
CREATE ROLE ob_replica LOGIN IN ROLE idem_client, ob_svc_a;
CREATE TEMP TABLE tokens (who text, id bigint, token uuid);
GRANT ALL ON tokens TO ob_svc_a, ob_svc_b, ob_replica;
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;

-- Service a and service b stage events with the same key.
SET ROLE ob_svc_a;
SELECT idem_outbox_stage('obs.a', '{"n": 1}'::jsonb, 'shared-key') > 0 AS a1,
       idem_outbox_stage('obs.a', '{"n": 2}'::jsonb, 'shared-key') > 0 AS a2;
SET ROLE ob_svc_b;
SELECT idem_outbox_stage('obs.b', '{"n": 1}'::jsonb, 'shared-key') > 0 AS b1;
-- A client role cannot read the tables, but sees its own backlog.
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox$$);
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_queue$$);
SELECT topic, state, events FROM idem_outbox_backlog();
RESET ROLE;
SELECT topic, scope::regrole, payload FROM idem_outbox WHERE topic LIKE 'obs.%' ORDER BY id;

-- b's drainer gets b's event only: a's head of the same key neither is
-- handed out nor holds b's event back.
SET ROLE ob_svc_b;
INSERT INTO tokens SELECT 'b', id, claim_token FROM idem_outbox_claim(10);
SELECT count(*) AS claimed_by_b FROM tokens WHERE who = 'b';
-- b cannot ack or nack a's events, even knowing their ids: its token does
-- not hold them.
RESET ROLE;
SET ROLE ob_svc_a;
INSERT INTO tokens SELECT 'a', id, claim_token FROM idem_outbox_claim(10);
SELECT count(*) AS claimed_by_a FROM tokens WHERE who = 'a';
RESET ROLE;
SELECT t.who, o.topic, o.payload, o.attempts
  FROM tokens t JOIN idem_outbox o USING (id) ORDER BY t.who, o.id;
SET ROLE ob_svc_b;
SELECT idem_outbox_ack((SELECT token FROM tokens WHERE who = 'b'),
                       ARRAY(SELECT id FROM tokens WHERE who = 'a')) AS b_acks_a;
SELECT n.outcome FROM tokens t,
       idem_outbox_nack((SELECT token FROM tokens WHERE who = 'b'), t.id, 'by b') n
 WHERE t.who = 'a';
-- Nor with a's own token, leaked to it: the ack and the nack check the
-- scope as well.
SELECT idem_outbox_ack(token, ARRAY[id]) AS b_acks_a_with_a_token FROM tokens WHERE who = 'a';
SELECT n.outcome AS b_nacks_a_with_a_token FROM tokens t,
       idem_outbox_nack(t.token, t.id, 'by b') n
 WHERE t.who = 'a';
-- b acks its own.
SELECT idem_outbox_ack(token, ARRAY[id]) AS b_acks_b FROM tokens WHERE who = 'b';
SELECT topic, state, events FROM idem_outbox_backlog();
RESET ROLE;

-- A member of a's role shares a's events by SET idem.scope; a role that
-- is not a member is refused.
SET ROLE ob_replica;
SELECT count(*) AS replica_own_scope FROM idem_outbox_claim(10);
SET idem.scope = 'ob_svc_a';
SELECT topic, state, events FROM idem_outbox_backlog();
SELECT idem_outbox_ack(token, ARRAY[id]) AS replica_acks_a FROM tokens WHERE who = 'a';
-- a's second event, no longer held back by the first.
SELECT topic, payload, attempts FROM idem_outbox_claim(10);
RESET idem.scope;
RESET ROLE;
SET ROLE ob_svc_b;
SET idem.scope = 'ob_svc_a';
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_claim(10)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('obs.b', '{}'::jsonb)$$);
RESET idem.scope;
RESET ROLE;

-- Events of 0.2.0 (scope 0): claimable by every scope's drainers.
UPDATE idem_outbox SET scope = 0, state = 'pending', available_at = clock_timestamp(),
       claim_token = NULL
 WHERE topic = 'obs.a' AND payload = '{"n": 2}';
SELECT idem_outbox_stage('obs.legacy', '{"n": 3}'::jsonb) > 0 AS staged;
UPDATE idem_outbox SET scope = 0 WHERE topic = 'obs.legacy';
SET ROLE ob_svc_b;
SELECT topic, payload FROM idem_outbox_claim(10) ORDER BY id;
RESET ROLE;

-- Admins see every scope through the view (and the tables).
SET ROLE idem_admin;
SELECT topic, scope::regrole, state FROM idem_outbox WHERE topic LIKE 'obs.%' ORDER BY id;
SELECT count(*) >= 0 AS admin_reads_tables FROM idem_outbox_queue, idem_outbox_claimed;
RESET ROLE;
DELETE FROM idem_outbox WHERE topic LIKE 'obs.%';
SELECT count(*) AS left_over FROM idem_outbox WHERE topic LIKE 'obs.%';
TRUNCATE tokens;

--
-- Batch staging: one INSERT, ids in array order, per-key order kept.
--
SET ROLE ob_svc_a;
SELECT count(*) AS staged, bool_and(id > 0) AS ids
  FROM idem_outbox_stage_batch('obs.batch',
         ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[],
         ARRAY['k1', NULL, 'k1', 'k2'],
         ARRAY['{"h": 1}', NULL, NULL, '{"h": 4}']::jsonb[]) AS s(id);
SELECT payload, key, headers FROM idem_outbox_claim(10) ORDER BY id;
SELECT * FROM idem_outbox_stage_batch('obs.batch', '{}'::jsonb[]);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}', NULL]::jsonb[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}']::jsonb[], ARRAY['a', 'b'])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}']::jsonb[], ARRAY[''])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}']::jsonb[], NULL, ARRAY['[1]']::jsonb[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}']::jsonb[], NULL, ARRAY['{}', '{}']::jsonb[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY[['{}']]::jsonb[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', array_fill('{}'::jsonb, ARRAY[10001]))$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('', ARRAY['{}']::jsonb[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_stage_batch('obs.batch', ARRAY['{}']::jsonb[], delay => '-1 s')$$);

--
-- idem_outbox_stage_bytes: a binary payload without the overload's
-- ambiguity; the deprecated bytea overload still works.
--
SELECT idem_outbox_stage_bytes('obs.bytes', '\x0102', 'kb') > 0 AS staged_bytes,
       idem_outbox_stage('obs.bytes', '\x0304'::bytea) > 0 AS staged_overload;
SELECT pg_temp.err($$SELECT idem_outbox_stage_bytes('obs.bytes', NULL)$$);
RESET ROLE;
SELECT payload IS NULL AS no_json, payload_bytes, message_key, scope::regrole
  FROM idem_outbox WHERE topic = 'obs.bytes' ORDER BY id;
DELETE FROM idem_outbox WHERE topic LIKE 'obs.%';

--
-- The ack archives (default) or deletes (idem.outbox_archive = off).
--
SET ROLE ob_svc_a;
SELECT idem_outbox_stage('obs.ack', '{"n": 1}'::jsonb) > 0 AS staged;
INSERT INTO tokens SELECT 'a', id, claim_token FROM idem_outbox_claim(10);
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM tokens;
RESET ROLE;
SELECT (SELECT count(*) FROM idem_outbox_queue WHERE topic = 'obs.ack') AS queued,
       (SELECT count(*) FROM idem_outbox_claimed WHERE topic = 'obs.ack' AND state = 'published') AS archived,
       (SELECT state || ' ' || attempts || ' ' || scope::regrole FROM idem_outbox WHERE topic = 'obs.ack') AS seen;
TRUNCATE tokens;
SET ROLE ob_svc_a;
SELECT pg_temp.err($$SET idem.outbox_archive = off$$);
RESET ROLE;
SET idem.outbox_archive = off;
SET ROLE ob_svc_a;
SELECT idem_outbox_stage('obs.ack', '{"n": 2}'::jsonb) > 0 AS staged;
INSERT INTO tokens SELECT 'a', id, claim_token FROM idem_outbox_claim(10);
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked FROM tokens;
RESET ROLE;
SELECT payload, state FROM idem_outbox WHERE topic = 'obs.ack' ORDER BY id;
RESET idem.outbox_archive;
TRUNCATE tokens;
-- Hand edits through the view reach both tables; prune empties both.
UPDATE idem_outbox SET last_error = 'edited' WHERE topic = 'obs.ack';
SELECT last_error FROM idem_outbox_claimed WHERE topic = 'obs.ack' AND state = 'published';
SELECT pg_temp.err($$INSERT INTO idem_outbox (topic, payload, available_at) VALUES ('obs.x', '{}', now())$$);
SELECT idem_outbox_prune('0', 1000000) >= 1 AS pruned;
SELECT count(*) AS left_over FROM idem_outbox WHERE topic LIKE 'obs.%';

-- An inbox dead letter is staged through the C entry point
-- (idem_outbox_stage_event) in the consumer's scope, its text escaped.
SET ROLE ob_svc_a;
BEGIN;
SELECT idem_inbox_begin('obs-consumer', 'm "1"', sha256('p'), 1) IS NOT NULL AS began;
ROLLBACK;
SELECT count(*) AS failed FROM idem_inbox_fail('obs-consumer', 'm "1"', E'broke: "quoted"\n\\ and \u00fc');
RESET ROLE;
SELECT topic, scope::regrole, payload FROM idem_outbox
 WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' = 'obs-consumer';
DELETE FROM idem_outbox WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' = 'obs-consumer';
DELETE FROM idem_inbox WHERE consumer = 'obs-consumer';

DROP TABLE tokens;
DROP ROLE ob_replica;
DROP ROLE ob_svc_b;
DROP ROLE ob_svc_a;
