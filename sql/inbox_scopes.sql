-- A session's inbox attempts are its own per scope: SET ROLE, SET SESSION
-- AUTHORIZATION and a SECURITY DEFINER function each see only the
-- attempts of their own scope.  Before 0.6.0 a session kept its attempts
-- by (consumer, message_id) alone: under SET ROLE, role A's open attempt
-- made role B's first delivery of the same message fail with 55000, B's
-- idem_inbox_fail was recorded on A's message, and a SECURITY DEFINER
-- function owned by B could mark done a message its caller A began.
CREATE ROLE ibs_a LOGIN IN ROLE idem_client;
CREATE ROLE ibs_b LOGIN IN ROLE idem_client;
GRANT ibs_a, ibs_b TO CURRENT_USER;
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
CREATE FUNCTION pg_temp.messages()
RETURNS TABLE (role regrole, message_id text, state text, error_count integer, last_error text)
LANGUAGE sql AS $$
  SELECT scope, message_id, state, error_count, last_error FROM idem_inbox
   WHERE consumer = 'ibs' ORDER BY scope::text, message_id
$$;

-- SET ROLE: A's open attempt and B's first delivery of the same message,
-- in one transaction, are two messages.
BEGIN;
SET LOCAL ROLE ibs_a;
SELECT idem_inbox_begin('ibs', 'm1', sha256('p'), 3) AS a_begins;
SET LOCAL ROLE ibs_b;
-- B cannot mark A's message done: B has no attempt at it.
SELECT pg_temp.err($$SELECT idem_inbox_done('ibs', 'm1')$$) AS b_done;
SELECT idem_inbox_begin('ibs', 'm1', sha256('p'), 3) AS b_begins;
-- B's handler fails (the savepoint protocol): the failure is B's.
SAVEPOINT handler;
ROLLBACK TO SAVEPOINT handler;
SELECT outcome, error_count FROM idem_inbox_fail('ibs', 'm1', 'b failed');
SET LOCAL ROLE ibs_a;
SELECT idem_inbox_done('ibs', 'm1') AS a_done;
COMMIT;
SELECT * FROM pg_temp.messages();

-- SET SESSION AUTHORIZATION: the same, across transactions.
SET SESSION AUTHORIZATION ibs_a;
BEGIN;
SELECT idem_inbox_begin('ibs', 'm2', sha256('p'), 3) AS a_begins;
ROLLBACK;
-- A's orphan is A's to record; B's fail of the same message records B's own.
SET SESSION AUTHORIZATION ibs_b;
SELECT outcome, error_count FROM idem_inbox_fail('ibs', 'm2', 'b reported');
BEGIN;
SELECT idem_inbox_begin('ibs', 'm2', sha256('p'), 3) AS b_begins;
SELECT idem_inbox_done('ibs', 'm2') AS b_done;
COMMIT;
SET SESSION AUTHORIZATION ibs_a;
SELECT outcome, error_count FROM idem_inbox_fail('ibs', 'm2', 'a failed');
RESET SESSION AUTHORIZATION;
SELECT * FROM pg_temp.messages();

-- A SECURITY DEFINER function owned by B, called by A inside A's attempt,
-- runs in B's scope: it cannot mark A's message done nor record its
-- failure; A's own calls still can.
CREATE FUNCTION ibs_b_done(c text, m text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
  PERFORM idem_inbox_done(c, m);
  RETURN 'done by b';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
ALTER FUNCTION ibs_b_done(text, text) OWNER TO ibs_b;
GRANT EXECUTE ON FUNCTION ibs_b_done(text, text) TO ibs_a;
SET ROLE ibs_a;
BEGIN;
SELECT idem_inbox_begin('ibs', 'm3', sha256('p'), 3) AS a_begins;
SELECT ibs_b_done('ibs', 'm3') AS through_b;
SELECT idem_inbox_done('ibs', 'm3') AS a_done;
COMMIT;
RESET ROLE;
SELECT * FROM pg_temp.messages();

DELETE FROM idem_outbox WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' = 'ibs';
DELETE FROM idem_inbox WHERE consumer = 'ibs';
DROP FUNCTION ibs_b_done(text, text);
REVOKE ibs_a, ibs_b FROM CURRENT_USER;
DROP ROLE ibs_a;
DROP ROLE ibs_b;
