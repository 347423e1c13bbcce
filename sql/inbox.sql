-- The message inbox: begin/done in the consumer's transaction, the
-- deferred check, failures with backoff and a hard cap, dead letters in
-- the outbox, legacy rows, revive, prune, and bad input.  This file's
-- consumers start with 'ib-'.

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
-- A message's row, without the parts that differ from run to run.
CREATE FUNCTION pg_temp.message(c text, m text)
RETURNS TABLE (state text, error_count integer, max_attempts integer,
               last_error text, hashed boolean, delay interval,
               started boolean, failed boolean, processed boolean, dead boolean)
LANGUAGE sql AS $$
  SELECT state, error_count, max_attempts, last_error, payload_hash IS NOT NULL,
         retry_at - failed_at, attempt_started_at IS NOT NULL,
         failed_at IS NOT NULL, processed_at IS NOT NULL, dead_at IS NOT NULL
    FROM idem_inbox WHERE consumer = c AND message_id = m
$$;
-- The dead-letter events staged for this file's consumers.
CREATE FUNCTION pg_temp.dead_letters()
RETURNS TABLE (topic text, payload jsonb, state text)
LANGUAGE sql AS $$
  SELECT topic, payload, state FROM idem_outbox
   WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' LIKE 'ib-%'
   ORDER BY id
$$;

--
-- The happy path: process, then duplicate; a different payload is a
-- mismatch, and nothing is written for it.
--
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-1', sha256('payload 1'));
SELECT state FROM idem_inbox WHERE consumer = 'ib-orders';
SELECT idem_inbox_done('ib-orders', 'm-1');
COMMIT;
SELECT * FROM pg_temp.message('ib-orders', 'm-1');
SELECT inbox_key = sha256('pg_idem inbox v1'::bytea
                          || '\x00000009'::bytea || 'ib-orders'::bytea
                          || '\x00000003'::bytea || 'm-1'::bytea) AS key_is_documented_digest
  FROM idem_inbox WHERE consumer = 'ib-orders' AND message_id = 'm-1';
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-1', sha256('payload 1'));
SELECT idem_inbox_begin('ib-orders', 'm-1', sha256('payload 2'));
COMMIT;
-- The same message id for another consumer is another message.
BEGIN;
SELECT idem_inbox_begin('ib-billing', 'm-1', sha256('payload 1'), 3);
SELECT idem_inbox_done('ib-billing', 'm-1');
COMMIT;
SELECT consumer, message_id, state FROM idem_inbox
 WHERE consumer LIKE 'ib-%' ORDER BY consumer, message_id;

-- A handler whose transaction rolls back leaves nothing behind.
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-rollback', sha256('p'));
ROLLBACK;
SELECT count(*) AS rows_left FROM idem_inbox WHERE message_id = 'm-rollback';
-- ...and its failure is recorded afterwards, in a transaction of its own.
SELECT * FROM idem_inbox_fail('ib-orders', 'm-rollback', 'handler raised');
SELECT * FROM pg_temp.message('ib-orders', 'm-rollback');

--
-- The deferred constraint trigger: a transaction that began a message must
-- mark it done (or record its failure) before COMMIT.
--
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-unfinished', sha256('p'));
COMMIT;
SELECT count(*) AS rows_left FROM idem_inbox WHERE message_id = 'm-unfinished';
-- The rolled-back attempt is recorded before the message is begun again.
SELECT outcome, error_count FROM idem_inbox_fail('ib-orders', 'm-unfinished', 'no done');
-- The check runs at commit; SET CONSTRAINTS ... IMMEDIATE runs it early,
-- and the violation names the constraint.
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-unfinished', sha256('p'));
DO $$
DECLARE
  constraint_name text;
  state text;
BEGIN
  SET CONSTRAINTS idem_inbox_message_done IMMEDIATE;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS constraint_name = CONSTRAINT_NAME, state = RETURNED_SQLSTATE;
  RAISE NOTICE 'SQLSTATE %, constraint %', state, constraint_name;
END
$$;
ROLLBACK;
SELECT outcome, error_count FROM idem_inbox_fail('ib-orders', 'm-unfinished', 'no done');
-- A begin in autocommit mode cannot commit at all.
SELECT idem_inbox_begin('ib-orders', 'm-autocommit', sha256('p'));
SELECT outcome, error_count FROM idem_inbox_fail('ib-orders', 'm-autocommit', 'no done');

--
-- Failures: the delay doubles from idem.inbox_backoff_base up to
-- idem.inbox_backoff_max; at max_attempts the message is dead and its
-- dead-letter event is staged in the same transaction.
--
SHOW idem.inbox_backoff_base;
SHOW idem.inbox_backoff_max;
SET idem.inbox_backoff_max = '3s';
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
ROLLBACK;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-cap', 'timeout 1');
SELECT * FROM pg_temp.message('ib-payments', 'm-cap');
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
ROLLBACK;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-cap', 'timeout 2');
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
ROLLBACK;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-cap', 'timeout 3');
SELECT * FROM pg_temp.dead_letters();
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
ROLLBACK;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-cap', 'timeout 4');
SELECT * FROM pg_temp.message('ib-payments', 'm-cap');
SELECT * FROM pg_temp.dead_letters();
RESET idem.inbox_backoff_max;
-- Dead: never run again, and no second dead letter.
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
COMMIT;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-cap', 'late failure');
SELECT count(*) AS dead_letters FROM pg_temp.dead_letters();

-- An accounting transaction that rolls back counts nothing, and the
-- attempt is not lost: it is still unaccounted for in this session (and
-- would be recorded at exit; 0.2.0 forgot it).  The next delivery on this
-- session adopts it: it writes the failure before deciding, so the second
-- run starts from a count of 1, and when it rolls back too, the failure
-- recorded after it counts both runs.
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-accounting', sha256('p'), 3);
ROLLBACK;
BEGIN;
SELECT outcome, error_count FROM idem_inbox_fail('ib-payments', 'm-accounting', 'boom');
ROLLBACK;
SELECT count(*) AS rows_after_aborted_accounting
  FROM idem_inbox WHERE message_id = 'm-accounting';
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-accounting', sha256('p'), 3);
SELECT error_count AS adopted_before_the_run FROM idem_inbox WHERE message_id = 'm-accounting';
ROLLBACK;
SELECT outcome, error_count FROM idem_inbox_fail('ib-payments', 'm-accounting', 'boom again');
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-accounting', sha256('p'), 3);
SELECT idem_inbox_done('ib-payments', 'm-accounting');
COMMIT;
SELECT * FROM pg_temp.message('ib-payments', 'm-accounting');

-- The savepoint protocol: the handler runs after SAVEPOINT; on error the
-- consumer rolls back to it and records the failure in the same
-- transaction, which keeps the row locked until the failure commits.
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-savepoint', sha256('p'), 2);
SAVEPOINT handler;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT handler;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-savepoint', 'division by zero');
COMMIT;
SELECT * FROM pg_temp.message('ib-payments', 'm-savepoint');
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-savepoint', sha256('p'), 2);
SAVEPOINT handler;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT handler;
SELECT * FROM idem_inbox_fail('ib-payments', 'm-savepoint', 'division by zero again');
COMMIT;
SELECT * FROM pg_temp.message('ib-payments', 'm-savepoint');
SELECT count(*) AS dead_letters FROM pg_temp.dead_letters();

-- begin itself refuses a message whose failures reached max_attempts
-- (here a failure recorded before max_attempts was known).
SELECT * FROM idem_inbox_fail('ib-payments', 'm-unknown', 'failed before any begin');
SELECT * FROM pg_temp.message('ib-payments', 'm-unknown');
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-unknown', sha256('p'), 1);
COMMIT;
SELECT * FROM pg_temp.message('ib-payments', 'm-unknown');
SELECT count(*) AS dead_letters FROM pg_temp.dead_letters();

-- A failure recorded after another delivery processed the message.
SELECT * FROM idem_inbox_fail('ib-orders', 'm-1', 'late');
SELECT * FROM pg_temp.message('ib-orders', 'm-1');

--
-- The session's own bookkeeping: an attempt that rolled back is counted by
-- the next begin of the message on this session (it adopts it: a pooled
-- connection's next client may deliver the same message), and a message
-- is begun once per transaction.
--
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-orphan', sha256('p'));
ROLLBACK;
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-orphan', sha256('p'));
SELECT error_count AS adopted FROM idem_inbox WHERE message_id = 'm-orphan';
SAVEPOINT handler;
ROLLBACK TO SAVEPOINT handler;
SELECT outcome, error_count FROM idem_inbox_fail('ib-orders', 'm-orphan', 'rolled back');
COMMIT;
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-orphan', sha256('p'));
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-orders', 'm-orphan', sha256('p'))$$);
SELECT idem_inbox_done('ib-orders', 'm-orphan');
SELECT pg_temp.err($$SELECT idem_inbox_done('ib-orders', 'm-orphan')$$);
COMMIT;
-- A begin inside a subtransaction that rolls back is an attempt that
-- rolled back, too.
BEGIN;
SAVEPOINT s;
SELECT idem_inbox_begin('ib-orders', 'm-subxact', sha256('p'));
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.err($$SELECT idem_inbox_done('ib-orders', 'm-subxact')$$);
COMMIT;
SELECT outcome, error_count FROM idem_inbox_fail('ib-orders', 'm-subxact', 'rolled back');
-- ...while one whose subtransaction commits stays part of the transaction.
BEGIN;
SAVEPOINT s;
SELECT idem_inbox_begin('ib-orders', 'm-subxact', sha256('p'));
RELEASE SAVEPOINT s;
SELECT idem_inbox_done('ib-orders', 'm-subxact');
COMMIT;
SELECT state, error_count FROM pg_temp.message('ib-orders', 'm-subxact');
-- done outside the transaction of its begin.
SELECT pg_temp.err($$SELECT idem_inbox_done('ib-orders', 'm-never-begun')$$);

--
-- Legacy rows with a NULL payload hash dedup any payload; a failed one is
-- processed and gets the hash of the delivery that takes it.
--
INSERT INTO idem_inbox (inbox_key, consumer, message_id, state, processed_at)
VALUES (sha256('legacy done'), 'ib-legacy', 'm-done', 'done', clock_timestamp()),
       (sha256('legacy failed'), 'ib-legacy', 'm-failed', 'failed', NULL);
UPDATE idem_inbox SET inbox_key = sha256('pg_idem inbox v1'::bytea
       || int4send(octet_length(consumer)) || convert_to(consumer, 'UTF8')
       || int4send(octet_length(message_id)) || convert_to(message_id, 'UTF8'))
 WHERE consumer = 'ib-legacy';
BEGIN;
SELECT idem_inbox_begin('ib-legacy', 'm-done', sha256('anything'));
SELECT idem_inbox_begin('ib-legacy', 'm-failed', sha256('new payload'));
SELECT idem_inbox_done('ib-legacy', 'm-failed');
COMMIT;
SELECT message_id, state, payload_hash = sha256('new payload') AS hash_filled
  FROM idem_inbox WHERE consumer = 'ib-legacy' ORDER BY message_id;

--
-- Revive a dead message on purpose: a fresh count of attempts.
--
SELECT idem_inbox_retry('ib-payments', 'm-cap') AS revived;
SELECT * FROM pg_temp.message('ib-payments', 'm-cap');
SELECT idem_inbox_retry('ib-payments', 'm-cap') AS revived_again;
SELECT idem_inbox_retry('ib-orders', 'm-1') AS revived_done;
SELECT idem_inbox_retry('ib-orders', 'm-missing') AS revived_missing;
BEGIN;
SELECT idem_inbox_begin('ib-payments', 'm-cap', sha256('p'), 4);
SELECT idem_inbox_done('ib-payments', 'm-cap');
COMMIT;
SELECT state, error_count FROM pg_temp.message('ib-payments', 'm-cap');

--
-- Prune: done and dead messages only, at most batch per call.
--
SELECT idem_inbox_prune('1 hour') AS pruned_none_old_enough;
SELECT state, count(*) FROM idem_inbox WHERE consumer LIKE 'ib-%' GROUP BY state ORDER BY state;
SELECT idem_inbox_prune('0', 2) AS pruned;
SELECT idem_inbox_prune('0', 1000) > 0 AS pruned_rest;
SELECT state, count(*) FROM idem_inbox WHERE consumer LIKE 'ib-%' GROUP BY state ORDER BY state;
-- A pruned message delivered again is processed again.
BEGIN;
SELECT idem_inbox_begin('ib-orders', 'm-1', sha256('payload 1'));
SELECT idem_inbox_done('ib-orders', 'm-1');
COMMIT;

--
-- Bad input: clear errors, never a silent default.
--
SELECT pg_temp.err($$SELECT idem_inbox_begin(NULL, 'm', sha256('p'))$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', NULL, sha256('p'))$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('', 'm', sha256('p'))$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', '', sha256('p'))$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', 'm', NULL)$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', 'm', '\x01')$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', 'm', sha256('p'), NULL)$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', 'm', sha256('p'), 0)$$);
SELECT pg_temp.err($$SELECT idem_inbox_begin('ib-bad', 'm', sha256('p'), 1001)$$);
SELECT pg_temp.err($$SELECT idem_inbox_done(NULL, 'm')$$);
SELECT pg_temp.err($$SELECT idem_inbox_done('ib-bad', '')$$);
SELECT pg_temp.err($$SELECT idem_inbox_fail('ib-bad', 'm', NULL)$$);
SELECT pg_temp.err($$SELECT idem_inbox_fail(NULL, 'm', 'e')$$);
SELECT pg_temp.err($$SELECT idem_inbox_retry('ib-bad', NULL)$$);
SELECT pg_temp.err($$SELECT idem_inbox_prune(NULL)$$);
SELECT pg_temp.err($$SELECT idem_inbox_prune('-1 s')$$);
SELECT pg_temp.err($$SELECT idem_inbox_prune('1 day', 0)$$);
SELECT pg_temp.err($$SELECT idem_inbox_prune('1 day', NULL)$$);
SELECT pg_temp.err($$SET idem.inbox_backoff_base = 0$$);
SELECT pg_temp.err($$SELECT idem_inbox_message_done()$$);
SELECT count(*) AS bad_rows FROM idem_inbox WHERE consumer = 'ib-bad';

-- Clean up.
DELETE FROM idem_outbox WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' LIKE 'ib-%';
DELETE FROM idem_inbox WHERE consumer LIKE 'ib-%';
