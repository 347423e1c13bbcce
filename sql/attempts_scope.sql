-- Attempts are scoped per role like keys, messages and events (issue 24,
-- defect 5): role B neither resumes, fails, stores, promotes nor reopens
-- role A's attempt, even with its attempt id, and gets the answer a
-- made-up id gets (no oracle); B's open of A's (kind, target, request
-- id) is B's own new attempt, never forbidden (which would say that A's
-- exists); a replace-kind target has a current attempt per scope.
-- created_by is the caller's own label: it separates principals inside a
-- scope only.
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9a-f-]{36}', '<id>');
END $$;
SELECT idem_attempt_register_kind('rs_doc', 'replace', 'docs');
CREATE ROLE regress_att_a;
CREATE ROLE regress_att_b;
GRANT idem_client TO regress_att_a, regress_att_b;
CREATE TABLE att_ids (who text, attempt_id uuid);
GRANT ALL ON att_ids TO regress_att_a, regress_att_b;

-- A opens, stores and promotes; a second request of A's stays pending.
SET ROLE regress_att_a;
INSERT INTO att_ids SELECT 'a', attempt_id
  FROM idem_attempt_open('rs_doc', 't/1', 'req-1', 'alice', '{"v": 1}', 'a.pdf');
INSERT INTO att_ids SELECT 'a-pending', attempt_id
  FROM idem_attempt_open('rs_doc', 't/1', 'req-2', 'alice', '{"v": 2}', 'b.pdf');
SELECT idem_attempt_store(attempt_id, 1, sha256('a')) AS a_stored FROM att_ids WHERE who = 'a';
SELECT idem_attempt_promote(attempt_id, 1, sha256('a')) AS a_promoted FROM att_ids WHERE who = 'a';
SELECT idem_attempt_current('rs_doc', 't/1') = attempt_id AS a_current FROM att_ids WHERE who = 'a';
RESET ROLE;

-- B: A's request is B's own new attempt (another created_by changes
-- nothing: it is not A's row B reads), and A's target has no current
-- attempt for B.
SET ROLE regress_att_b;
SELECT idem_attempt_current('rs_doc', 't/1') AS b_current;
SELECT decision, generation, status
  FROM idem_attempt_open('rs_doc', 't/1', 'req-2', 'mallory', '{"v": 9}', 'x.pdf');
CREATE TEMP TABLE b_open AS
SELECT decision, attempt_id FROM idem_attempt_open('rs_doc', 't/1', 'req-1', 'alice', '{"v": 1}', 'a.pdf');
SELECT decision FROM b_open;
-- A's attempt id, however leaked, answers as a made-up one.
SELECT pg_temp.try(format('SELECT idem_attempt_store(%L, 1, sha256(''x''))', attempt_id)) AS store_a,
       pg_temp.try(format('SELECT idem_attempt_store(%L, 1, sha256(''x''))', gen_random_uuid())) AS store_ghost
  FROM att_ids WHERE who = 'a-pending';
SELECT pg_temp.try(format('SELECT idem_attempt_fail(%L, 1, ''target_gone'')', attempt_id)) AS fail_a
  FROM att_ids WHERE who = 'a-pending';
SELECT pg_temp.try(format('SELECT idem_attempt_promote(%L, 1, sha256(''a''))', attempt_id)) AS promote_a
  FROM att_ids WHERE who = 'a';
SELECT pg_temp.try(format('SELECT idem_attempt_reopen(%L, 1)', attempt_id)) AS reopen_a
  FROM att_ids WHERE who = 'a-pending';
-- B promotes its own attempt at the same target: its own current one,
-- and A's promoted attempt is not superseded.
SELECT idem_attempt_store(attempt_id, 1, sha256('b')) AND
       idem_attempt_promote(attempt_id, 1, sha256('b')) AS b_promoted FROM b_open;
SELECT idem_attempt_current('rs_doc', 't/1') = attempt_id AS b_current_is_b FROM b_open;
RESET ROLE;

-- What each role's attempts are now, as an admin sees them.
SELECT scope::regrole AS scope, client_request_id, created_by, status, generation
  FROM idem_attempts WHERE kind = 'rs_doc' ORDER BY scope::regrole::text, client_request_id;
SET ROLE regress_att_a;
SELECT idem_attempt_current('rs_doc', 't/1') = attempt_id AS a_still_current FROM att_ids WHERE who = 'a';
RESET ROLE;
SELECT scope::regrole AS scope, target FROM idem_attempt_targets WHERE kind = 'rs_doc'
 ORDER BY scope::regrole::text;

DELETE FROM idem_outbox WHERE topic LIKE 'rs_doc.%';
DELETE FROM idem_attempt_targets WHERE kind = 'rs_doc';
DELETE FROM idem_attempts WHERE kind = 'rs_doc';
DELETE FROM idem_attempt_kinds WHERE kind = 'rs_doc';
DROP TABLE att_ids, b_open;
REVOKE idem_client FROM regress_att_a, regress_att_b;
DROP ROLE regress_att_a, regress_att_b;
