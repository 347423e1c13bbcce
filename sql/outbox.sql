-- The transactional outbox: staging, claims with per-key order, ack/nack
-- fencing, backoff and dead events, prune, the wake-up, and bad input.
--
-- Claims see every pending event of the database, so events other tests
-- left pending are parked for the length of this file and put back at the
-- end.  This file's own keys start with 'ob-'.
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox WHERE state = 'pending';
UPDATE idem_outbox SET available_at = 'infinity'
 WHERE id IN (SELECT id FROM parked);

-- A claim's rows without the parts that differ from run to run.
CREATE TEMP TABLE claimed (id bigint, topic text, key text, payload jsonb,
  payload_bytes bytea, headers jsonb, attempts integer,
  claim_token uuid, lease_expires_at timestamptz);
CREATE FUNCTION pg_temp.claim(batch integer, lease interval DEFAULT '1 min')
RETURNS TABLE (topic text, key text, payload jsonb, attempts integer)
LANGUAGE sql AS $$
  WITH c AS (
    INSERT INTO claimed
    SELECT id, topic, key, payload, payload_bytes, headers, attempts,
           claim_token, lease_expires_at
      FROM idem_outbox_claim(batch, lease)
    RETURNING *)
  SELECT topic, key, payload, attempts FROM c ORDER BY id
$$;
-- Let a backing-off or delayed event of a topic be claimable now.
CREATE FUNCTION pg_temp.fast_forward(of_topic text) RETURNS void
LANGUAGE sql AS $$
  UPDATE idem_outbox SET available_at = clock_timestamp()
   WHERE topic = of_topic AND state = 'pending' AND claim_token IS NULL
$$;
-- An error's SQLSTATE and message, so that bad input shows both.
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;

--
-- Staging.
--
SELECT idem_outbox_stage('ob.created', '{"n": 1}'::jsonb) > 0 AS staged;
SELECT topic, message_key, key_hash IS NULL AS no_hash, payload, payload_bytes,
       headers, state, attempts, claim_token IS NULL AS unclaimed,
       available_at <= clock_timestamp() AS claimable_now
  FROM idem_outbox WHERE topic = 'ob.created';

-- A binary payload, a key (stored with its SHA-256), headers.
SELECT idem_outbox_stage('ob.bytes', '\x00ff'::bytea, 'ob-key-bytes',
                         '{"content-type": "application/octet-stream", "n": 2}') > 0 AS staged;
SELECT payload IS NULL AS no_json, payload_bytes, message_key,
       key_hash = sha256(convert_to('ob-key-bytes', 'UTF8')) AS key_hashed, headers
  FROM idem_outbox WHERE topic = 'ob.bytes';

-- A delayed event becomes claimable only after its delay.
SELECT idem_outbox_stage('ob.delayed', '{}'::jsonb, delay => '1 hour') > 0 AS staged;
SELECT available_at > clock_timestamp() + interval '59 minutes' AS delayed
  FROM idem_outbox WHERE topic = 'ob.delayed';

-- Staged in a transaction that rolls back: the event never existed.
BEGIN;
SELECT idem_outbox_stage('ob.rolled-back', '{}'::jsonb) > 0 AS staged;
ROLLBACK;
SELECT count(*) AS rolled_back_events FROM idem_outbox WHERE topic = 'ob.rolled-back';

-- Start the ordering tests from an empty queue.
UPDATE idem_outbox SET state = 'published', published_at = clock_timestamp()
 WHERE topic IN ('ob.created', 'ob.bytes', 'ob.delayed');

--
-- Claims: at most batch rows, and per-key order.
--
SELECT idem_outbox_stage('ob.order', '{"k": "a", "n": 1}'::jsonb, 'ob-a') > 0 AS a1,
       idem_outbox_stage('ob.order', '{"k": "a", "n": 2}'::jsonb, 'ob-a') > 0 AS a2,
       idem_outbox_stage('ob.order', '{"k": "b", "n": 1}'::jsonb, 'ob-b') > 0 AS b1,
       idem_outbox_stage('ob.order', '{"k": null, "n": 1}'::jsonb) > 0 AS n1,
       idem_outbox_stage('ob.order', '{"k": null, "n": 2}'::jsonb) > 0 AS n2;

-- Batch 2: the two oldest claimable events.
SELECT * FROM pg_temp.claim(2);
-- The rest: a2 is held back while a1 is unpublished.
SELECT * FROM pg_temp.claim(10);
-- Nothing else is claimable: leased rows are not handed out twice.
SELECT count(*) AS claimable FROM idem_outbox_claim(10);
-- Two claims, two fresh tokens, live leases.
SELECT count(DISTINCT claim_token) AS tokens,
       bool_and(lease_expires_at > clock_timestamp()) AS leased
  FROM claimed;

-- Ack a1 (twice in the array, and with an id the claim does not hold).
SELECT idem_outbox_ack(c.claim_token, ARRAY[c.id, c.id, 0]) AS acked
  FROM claimed c WHERE c.payload = '{"k": "a", "n": 1}';
-- Now a2 is claimable.
SELECT * FROM pg_temp.claim(10);
-- An ack with another claim's token changes nothing.
SELECT idem_outbox_ack(b.claim_token, ARRAY[a.id]) AS acked
  FROM claimed a, claimed b
 WHERE a.payload = '{"k": "a", "n": 2}' AND b.payload = '{"k": "b", "n": 1}';
SELECT idem_outbox_ack(claim_token, array_agg(id)) AS acked
  FROM claimed GROUP BY claim_token ORDER BY 1;
SELECT state, count(*) FROM idem_outbox WHERE topic = 'ob.order' GROUP BY state;
-- An empty array acks nothing.
SELECT idem_outbox_ack(gen_random_uuid(), '{}') AS acked;
TRUNCATE claimed;

--
-- Leases: a drainer that does not ack loses its rows when the lease ends;
-- its late ack changes nothing.
--
SELECT idem_outbox_stage('ob.lease', '{"n": 1}'::jsonb, 'ob-lease') > 0 AS staged;
SELECT * FROM pg_temp.claim(10, '10ms');
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim(10);
SELECT count(DISTINCT claim_token) AS tokens FROM claimed;
-- The first (stale) token: nothing acked, nack is stale.
SELECT idem_outbox_ack(c.claim_token, ARRAY[c.id]) AS stale_ack
  FROM claimed c WHERE c.attempts = 1;
SELECT n.* FROM claimed c, idem_outbox_nack(c.claim_token, c.id, 'late') n
 WHERE c.attempts = 1;
SELECT state, attempts, last_error FROM idem_outbox WHERE topic = 'ob.lease';
-- The current token acks.
SELECT idem_outbox_ack(c.claim_token, ARRAY[c.id]) AS acked
  FROM claimed c WHERE c.attempts = 2;
SELECT state, attempts, published_at IS NOT NULL AS published
  FROM idem_outbox WHERE topic = 'ob.lease';
TRUNCATE claimed;

--
-- Nack: backoff by the schedule, then dead after the last attempt; a dead
-- event does not hold back its key.
--
SHOW idem.outbox_backoff;
SHOW idem.outbox_max_attempts;
SELECT idem_outbox_stage('ob.nack', '{"n": 1}'::jsonb, 'ob-nack') > 0 AS first,
       idem_outbox_stage('ob.nack', '{"n": 2}'::jsonb, 'ob-nack') > 0 AS second;
SELECT * FROM pg_temp.claim(10);
-- The nack's own clock reading lies between these two, however slow the
-- server is (no timing in the expected output).
SELECT clock_timestamp() AS before_nack \gset
SELECT n.* FROM claimed c, idem_outbox_nack(c.claim_token, c.id, 'broker down') n;
SELECT state, attempts, last_error, claim_token IS NULL AS released,
       available_at BETWEEN :'before_nack'::timestamptz + interval '5 s'
                        AND clock_timestamp() + interval '5 s' AS backing_off
  FROM idem_outbox WHERE payload = '{"n": 1}' AND topic = 'ob.nack';
-- Backing off: neither it nor its key's next event is claimable.
SELECT count(*) AS claimable FROM idem_outbox_claim(10);
-- A nack repeated with the same token is stale (the nack released the row).
SELECT n.* FROM claimed c, idem_outbox_nack(c.claim_token, c.id, 'again') n;
TRUNCATE claimed;

-- A schedule of zero delays and two attempts: the second nack is final.
SET idem.outbox_backoff = '0';
SET idem.outbox_max_attempts = 2;
SELECT pg_temp.fast_forward('ob.nack');
SELECT * FROM pg_temp.claim(10);
SELECT n.* FROM claimed c, idem_outbox_nack(c.claim_token, c.id, 'broker still down') n;
SELECT state, attempts, last_error, dead_at IS NOT NULL AS dead
  FROM idem_outbox WHERE payload = '{"n": 1}' AND topic = 'ob.nack';
TRUNCATE claimed;
-- The dead event no longer holds back its key.
SELECT * FROM pg_temp.claim(10);
SELECT idem_outbox_ack(claim_token, array_agg(id)) AS acked FROM claimed GROUP BY claim_token;
TRUNCATE claimed;

-- A drainer that dies during the last attempt: the next claim marks the
-- event dead instead of handing it out a third time.
SELECT idem_outbox_stage('ob.exhausted', '{"n": 1}'::jsonb, 'ob-exhausted') > 0 AS staged;
SELECT * FROM pg_temp.claim(10, '10ms');
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim(10, '10ms');
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim(10);
SELECT state, attempts, last_error FROM idem_outbox WHERE topic = 'ob.exhausted';
TRUNCATE claimed;

-- The schedule's steps, one per attempt, the last one repeating.
SET idem.outbox_backoff = '1min, 2h';
SET idem.outbox_max_attempts = 4;
SELECT idem_outbox_stage('ob.schedule', '{}'::jsonb) > 0 AS staged;
CREATE FUNCTION pg_temp.claim_and_nack() RETURNS SETOF idem_outbox_nack_result
LANGUAGE sql AS $$
  SELECT pg_temp.fast_forward('ob.schedule');
  SELECT n.* FROM idem_outbox_claim(1) c, idem_outbox_nack(c.claim_token, c.id, 'no') n
$$;
SELECT * FROM pg_temp.claim_and_nack();
SELECT * FROM pg_temp.claim_and_nack();
SELECT * FROM pg_temp.claim_and_nack();
SELECT * FROM pg_temp.claim_and_nack();
SELECT state, attempts FROM idem_outbox WHERE topic = 'ob.schedule';
RESET idem.outbox_backoff;
RESET idem.outbox_max_attempts;

-- Bad schedules are refused when set.
SELECT pg_temp.err($$SET idem.outbox_backoff = 'soon'$$);
SELECT pg_temp.err($$SET idem.outbox_backoff = ''$$);
SELECT pg_temp.err($$SET idem.outbox_backoff = '1s, -2s'$$);
SELECT pg_temp.err($$SET idem.outbox_max_attempts = 0$$);
SHOW idem.outbox_backoff;
-- (The SQL edition keeps a bad value until it is used: back to the defaults.)
RESET idem.outbox_backoff;
RESET idem.outbox_max_attempts;

--
-- The wake-up.
--
SELECT idem_outbox_wait('0') AS work_now;
SELECT idem_outbox_wait('20 ms') AS work_within_20ms;
SELECT idem_outbox_stage('ob.wake', '{}'::jsonb) > 0 AS staged;
SELECT idem_outbox_wait('10 s') AS work_now;
SELECT * FROM pg_temp.claim(10);
SELECT idem_outbox_ack(claim_token, array_agg(id)) AS acked FROM claimed GROUP BY claim_token;
-- A key held back by an earlier leased event is not work.
SELECT idem_outbox_stage('ob.wake', '{"n": 2}'::jsonb, 'ob-wake') > 0 AS first,
       idem_outbox_stage('ob.wake', '{"n": 3}'::jsonb, 'ob-wake') > 0 AS second;
TRUNCATE claimed;
SELECT * FROM pg_temp.claim(1);
SELECT idem_outbox_wait('20 ms') AS work_within_20ms;
SELECT idem_outbox_ack(claim_token, array_agg(id)) AS acked FROM claimed GROUP BY claim_token;
SELECT idem_outbox_wait('0') AS work_now;
TRUNCATE claimed;
SELECT * FROM pg_temp.claim(10);
SELECT idem_outbox_ack(claim_token, array_agg(id)) AS acked FROM claimed GROUP BY claim_token;
TRUNCATE claimed;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err($$SELECT idem_outbox_wait('0')$$);
ROLLBACK;

--
-- Prune: finished events only, at most batch per call.
--
SELECT idem_outbox_stage('ob.pending', '{}'::jsonb, delay => '1 hour') > 0 AS staged;
SELECT idem_outbox_prune('1 hour') AS pruned_none_old_enough;
SELECT idem_outbox_prune('0', 2) AS pruned;
SELECT idem_outbox_prune('0', 1000000) > 0 AS pruned_rest;
SELECT state, count(*) FROM idem_outbox WHERE topic LIKE 'ob.%' GROUP BY state;
DELETE FROM idem_outbox WHERE topic = 'ob.pending';

--
-- Bad input: clear errors, never a silent default.
--
SELECT pg_temp.err($$SELECT idem_outbox_stage(NULL, '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('', '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage(repeat('t', 256), '{}'::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', NULL::jsonb)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', NULL::bytea)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}'::jsonb, '')$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}'::jsonb, headers => '["a"]')$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}'::jsonb, headers => '"a"')$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}'::jsonb, delay => '-1 s')$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}'::jsonb, delay => NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_stage('ob.bad', '{}')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(0)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(10001)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(1, '0')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(1, '-1 s')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_claim(1, '1 year')$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack(NULL, '{1}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack(gen_random_uuid(), NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack(gen_random_uuid(), '{1, NULL}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_ack(gen_random_uuid(), '{{1}, {2}}')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(NULL, 1, 'e')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), NULL, 'e')$$);
SELECT pg_temp.err($$SELECT idem_outbox_nack(gen_random_uuid(), 1, NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_prune(NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_prune('-1 day')$$);
SELECT pg_temp.err($$SELECT idem_outbox_prune('1 day', 0)$$);
SELECT pg_temp.err($$SELECT idem_outbox_prune('1 day', NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_wait(NULL)$$);
SELECT pg_temp.err($$SELECT idem_outbox_wait('-1 s')$$);
SELECT pg_temp.err($$SELECT idem_outbox_wait('1 year')$$);
SELECT count(*) AS bad_events FROM idem_outbox WHERE topic = 'ob.bad';

-- Clean up, and put back what other tests left pending.
DELETE FROM idem_outbox WHERE topic LIKE 'ob.%';
UPDATE idem_outbox o SET available_at = p.available_at
  FROM parked p WHERE o.id = p.id;
