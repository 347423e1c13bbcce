-- Dead letters you can redrive (issue 33).  idem_outbox_redrive and
-- idem_inbox_redrive make dead outbox events and dead inbox messages
-- deliverable again from a clean slate (attempts and failures counted
-- from zero, due now), only the caller's scope's (another role's are
-- neither redriven nor reported), each call recorded in idem_redrive_log;
-- a keyed event stays dead while a later event of its key is unpublished
-- (held_by names it), so a redriven event is never handed out after a
-- later one of its key; bad filters are refused with 22023 and a detail.
-- idem_outbox_stuck and idem_inbox_stuck show idem_admin what is stuck.
CREATE ROLE rd_svc_a LOGIN IN ROLE idem_client;
CREATE ROLE rd_svc_b LOGIN IN ROLE idem_client;
CREATE ROLE rd_ops LOGIN IN ROLE idem_admin;
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  d text;
BEGIN
  EXECUTE stmt;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
  RETURN SQLSTATE || ' ' || SQLERRM || coalesce(' / ' || nullif(d, ''), '');
END
$$;
-- Claim what is claimable and nack it: with one attempt allowed, dead.
CREATE FUNCTION pg_temp.kill() RETURNS bigint
LANGUAGE sql AS $$
  SELECT count(*) FROM idem_outbox_claim(100) c, idem_outbox_nack(c.claim_token, c.id, 'broker down') n
   WHERE n.outcome = 'dead'
$$;
CREATE FUNCTION pg_temp.events(ids bigint[]) RETURNS TABLE (n int, state text, attempts int, last_error text,
                                                            dead boolean, token boolean, due boolean)
LANGUAGE sql AS $$
  SELECT array_position(ids, q.id), q.state, q.attempts, q.last_error, q.dead_at IS NOT NULL,
         q.claim_token IS NOT NULL, q.available_at <= clock_timestamp()
    FROM idem_outbox q WHERE q.id = ANY (ids) ORDER BY 1
$$;

-- Service a: two events of key k1, one of k2, one without a key; all die.
-- (The settings are a superuser's; they hold for the session's roles.)
SET idem.outbox_max_attempts = 1;
SET ROLE rd_svc_a;
SELECT idem_outbox_stage('rd.orders', '{"n": 1}'::jsonb, 'k1') AS e1,
       idem_outbox_stage('rd.orders', '{"n": 2}'::jsonb, 'k1') AS e2,
       idem_outbox_stage('rd.orders', '{"n": 3}'::jsonb, 'k2') AS e3,
       idem_outbox_stage('rd.audit', '{"n": 4}'::jsonb) AS e4 \gset
SELECT pg_temp.kill() AS died_first, pg_temp.kill() AS died_after_their_key_was_free;
-- Service b: an event of the same key string, dead too.
SET ROLE rd_svc_b;
SELECT idem_outbox_stage('rd.orders', '{"n": "b"}'::jsonb, 'k1') AS b1 \gset
SELECT pg_temp.kill() AS b_died;
RESET ROLE;
SELECT * FROM pg_temp.events(ARRAY[:e1, :e2, :e3, :e4, :b1]);

-- Bad filters: each refused, naming what was wrong.
SET ROLE rd_svc_a;
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive()$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(topic => 'rd.orders', key => 'k1', all_dead => true)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(all_dead => NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(dead_since => '2030-01-02', dead_before => '2030-01-01')$$);
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(dead_since => '2030-01-01', dead_before => '2030-01-01')$$);
SELECT pg_temp.err($$SELECT * FROM idem_inbox_redrive()$$);
SELECT pg_temp.err($$SELECT * FROM idem_inbox_redrive(message_id => 'm1')$$);
SELECT pg_temp.err($$SELECT * FROM idem_inbox_redrive(consumer => 'rd-billing', all_dead => true)$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(all_dead => true)$$);
ROLLBACK;
SET idem.scope = 'rd_svc_b';
SELECT pg_temp.err($$SELECT * FROM idem_outbox_redrive(all_dead => true)$$);
RESET idem.scope;

-- b can neither redrive a's events nor learn of them, even by id.
SET ROLE rd_svc_b;
SELECT count(*) AS b_redrove_by_a_id FROM idem_outbox_redrive(id => :e4);
SELECT count(*) AS b_redrove_by_key FROM idem_outbox_redrive(topic => 'rd.audit');
SELECT id = :b1 AS only_b1, topic, key, redriven, held_by FROM idem_outbox_redrive(all_dead => true);
RESET ROLE;
SELECT * FROM pg_temp.events(ARRAY[:e1, :e2, :e3, :e4, :b1]);

-- A later event of k1 waits: a's dead events of k1 are held by it.
SET ROLE rd_svc_a;
SELECT idem_outbox_stage('rd.orders', '{"n": 5}'::jsonb, 'k1') AS e5 \gset
SELECT array_position(ARRAY[:e1, :e2], id) AS n, topic, key, redriven, held_by = :e5 AS held_by_e5
  FROM idem_outbox_redrive(key => 'k1');
-- Once it is published, they are redriven, in id order.
SELECT count(*) AS acked FROM idem_outbox_claim(10) c, idem_outbox_ack(c.claim_token, ARRAY[c.id]) a;
SELECT array_position(ARRAY[:e1, :e2], id) AS n, topic, key, redriven, held_by
  FROM idem_outbox_redrive(key => 'k1');
RESET ROLE;
SELECT * FROM pg_temp.events(ARRAY[:e1, :e2, :e3, :e4]);
-- The attempt cap counts again, and the key's order holds: e1 first.
SET idem.outbox_max_attempts = 2;
SET idem.outbox_backoff = '1h';
SET ROLE rd_svc_a;
SELECT array_position(ARRAY[:e1, :e2], id) AS n, attempts, claim_token AS tok FROM idem_outbox_claim(10) \gset
\echo claimed :n with attempts :attempts
SELECT outcome, attempts FROM idem_outbox_nack(:'tok', :e1, 'broker down again');
RESET ROLE;
RESET idem.outbox_backoff;
SELECT * FROM pg_temp.events(ARRAY[:e1, :e2]);
SET idem.outbox_max_attempts = 1;
SET ROLE rd_svc_a;
-- By topic and time: nothing died after now; e3 died before it.
SELECT count(*) AS died_later FROM idem_outbox_redrive(topic => 'rd.orders', dead_since => now() + '1 hour');
SELECT id = :e3 AS e3, redriven FROM idem_outbox_redrive(topic => 'rd.orders', dead_before => now() + '1 hour');
-- Everything else that is dead: e4.
SELECT id = :e4 AS e4, topic, key, redriven FROM idem_outbox_redrive(all_dead => true);
SELECT count(*) AS nothing_left FROM idem_outbox_redrive(all_dead => true);
RESET ROLE;

-- The audit: one row per call, in the caller's transaction.
SELECT redriven_by, scope, source,
       filter - 'dead_since' - 'dead_before' - 'id'
         || jsonb_build_object('id', CASE WHEN filter->>'id' = :'e4' THEN 'e4' ELSE filter->>'id' END) AS filter,
       redriven, held,
       CASE WHEN items = '[]' THEN 'none'
            WHEN items = to_jsonb(ARRAY[:e1, :e2]) THEN 'e1, e2'
            WHEN items = to_jsonb(ARRAY[:e3]) THEN 'e3'
            WHEN items = to_jsonb(ARRAY[:e4]) THEN 'e4'
            WHEN items = to_jsonb(ARRAY[:b1]) THEN 'b1' ELSE items::text END AS items
  FROM idem_redrive_log WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole) ORDER BY id;
SET ROLE rd_svc_a;
BEGIN;
SELECT count(*) AS redriven_then_rolled_back FROM idem_outbox_redrive(id => 1);
ROLLBACK;
RESET ROLE;
SELECT count(*) AS audit_rows FROM idem_redrive_log WHERE scope = 'rd_svc_a'::regrole;

-- Inbox: a's two messages and b's one die at their cap of one attempt.
CREATE FUNCTION pg_temp.die(consumer text, message_id text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_inbox_begin(consumer, message_id, sha256('payload'::bytea), 1);
  RETURN (SELECT outcome FROM idem_inbox_fail(consumer, message_id, 'handler failed'));
END
$$;
SET ROLE rd_svc_a;
SELECT pg_temp.die('rd-billing', 'm1') AS m1, pg_temp.die('rd-billing', 'm2') AS m2,
       pg_temp.die('rd-mail', 'm3') AS m3;
SET ROLE rd_svc_b;
SELECT pg_temp.die('rd-billing', 'm1') AS b_m1;
-- b redrives its own m1 only.
SELECT * FROM idem_inbox_redrive('rd-billing', 'm1');
SELECT * FROM idem_inbox_redrive(consumer => 'rd-mail');
SET ROLE rd_svc_a;
SELECT idem_inbox_begin('rd-billing', 'm1', sha256('payload'::bytea), 1) AS a_m1_still;
SELECT * FROM idem_inbox_redrive('rd-billing', 'm1');
SELECT * FROM idem_inbox_redrive(consumer => 'rd-billing', dead_before => now() + '1 hour');
RESET ROLE;
SELECT scope, consumer, message_id, state, error_count, max_attempts, last_error, dead_at IS NULL AS alive,
       retry_at IS NULL AS due
  FROM idem_inbox WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole) ORDER BY 1, 2, 3;
-- Redriven: the next delivery processes it, and the cap counts again.
SET ROLE rd_svc_a;
BEGIN;
SELECT idem_inbox_begin('rd-billing', 'm1', sha256('payload'::bytea), 1) AS a_m1_redelivered;
SELECT idem_inbox_done('rd-billing', 'm1');
COMMIT;
SELECT * FROM idem_inbox_redrive(all_dead => true);

-- The stuck views: idem_admin's, every scope named; not a client's.
SELECT pg_temp.err($$SELECT count(*) FROM idem_outbox_stuck$$) AS client_outbox_stuck;
SELECT pg_temp.err($$SELECT count(*) FROM idem_inbox_stuck$$) AS client_inbox_stuck;
SELECT pg_temp.err($$SELECT count(*) FROM idem_redrive_log$$) AS client_audit;
SELECT pg_temp.kill() AS killed_again;
SELECT idem_outbox_stage('rd.orders', '{"n": 6}'::jsonb, 'k1', delay => '1 hour') > 0 AS delayed;
SET ROLE rd_ops;
SELECT scope, topic, key, dead, waiting, lease_expired, leased, delayed,
       oldest_dead_at IS NOT NULL AS has_dead, longest_due_for IS NOT NULL AS overdue
  FROM idem_outbox_stuck WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole) ORDER BY 1, 2, 3;
SELECT scope, consumer, dead, failed, most_failures, oldest_dead_at IS NOT NULL AS has_dead
  FROM idem_inbox_stuck WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole) ORDER BY 1, 2;
-- An admin prunes the audit by hand; it may not write it otherwise.
SELECT pg_temp.err($$UPDATE idem_redrive_log SET held = 0$$) AS admin_update;
WITH gone AS (DELETE FROM idem_redrive_log WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole) RETURNING 1)
SELECT count(*) > 0 AS admin_pruned FROM gone;
RESET ROLE;

DELETE FROM idem_outbox_queue WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole);
DELETE FROM idem_outbox_claimed WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole);
DELETE FROM idem_inbox WHERE scope IN ('rd_svc_a'::regrole, 'rd_svc_b'::regrole);
DROP ROLE rd_svc_a, rd_svc_b, rd_ops;
RESET idem.outbox_max_attempts;
