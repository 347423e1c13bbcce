-- Multi-step attempts: kinds, intent hashing, object keys and safe names,
-- the replay decision table, every transition (legal, stale and illegal),
-- the promotion's outbox event (IL006), the replace-kind pointer, and the
-- reconciler's SQL side.  Kinds are rg_*; everything is removed at the end.
\set SHOW_CONTEXT never

-- Helpers: run a statement and show its SQLSTATE; open and show the
-- decision without random ids (the current attempt by its request id).
CREATE FUNCTION rg_try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE FUNCTION rg_open(kind text, target text, crid text, who text, intent jsonb,
                        name text DEFAULT 'file.pdf', digest bytea DEFAULT NULL)
RETURNS TABLE (decision text, generation bigint, status text, reason text,
               next_step text, object_key text, current_is text)
LANGUAGE sql AS $$
    SELECT d.decision, d.generation, d.status, d.failure_reason, d.next_step,
           replace(d.object_key, d.attempt_id::text, '<id>'),
           (SELECT a.client_request_id FROM idem_attempts a
             WHERE a.attempt_id = d.current_attempt_id)
      FROM idem_attempt_open(kind, target, crid, who, intent, name, digest) d
$$;

CREATE FUNCTION rg_id(crid text) RETURNS uuid LANGUAGE sql AS $$
    SELECT attempt_id FROM idem_attempts WHERE kind LIKE 'rg\_%' AND client_request_id = crid
$$;

CREATE FUNCTION rg_gen(crid text) RETURNS bigint LANGUAGE sql AS $$
    SELECT generation FROM idem_attempts WHERE kind LIKE 'rg\_%' AND client_request_id = crid
$$;

CREATE FUNCTION rg_state(crid text)
RETURNS TABLE (status text, reason text, generation bigint, object_key text,
               has_event boolean, superseded_by text)
LANGUAGE sql AS $$
    SELECT a.status, a.failure_reason, a.generation,
           replace(a.object_key, a.attempt_id::text, '<id>'),
           a.event_id IS NOT NULL,
           (SELECT b.client_request_id FROM idem_attempts b WHERE b.attempt_id = a.superseded_by)
      FROM idem_attempts a WHERE a.kind LIKE 'rg\_%' AND a.client_request_id = crid
$$;

--
-- Kinds
--
SELECT idem_attempt_register_kind('rg_order', 'replace', 'orders');
SELECT idem_attempt_register_kind('rg_order', 'replace', 'orders');   -- same again: false
SELECT idem_attempt_register_kind('rg_file', 'append', 'cases/files');
SELECT idem_attempt_register_kind('rg_order', 'append', 'orders');    -- never changes
SELECT idem_attempt_register_kind('rg_order', 'replace', 'other');
SELECT rg_try($$SELECT idem_attempt_register_kind('Bad-Kind', 'append', 'x')$$);
SELECT rg_try($$SELECT idem_attempt_register_kind('rg_x', 'upsert', 'x')$$);
SELECT rg_try($$SELECT idem_attempt_register_kind('rg_x', 'append', '../x')$$);
SELECT rg_try($$SELECT idem_attempt_register_kind('rg_x', 'append', '')$$);
SELECT rg_try($$SELECT idem_attempt_register_kind(NULL, 'append', 'x')$$);

--
-- Intent hash: SHA-256 of the jsonb text output.  Key order, whitespace
-- and duplicate keys do not change it; a number's written scale does.
--
SELECT idem_intent_hash('{"a": 1, "b": [1, 2]}') = idem_intent_hash('{ "b":[1,2],"a":1 }') AS key_order_and_space,
       idem_intent_hash('{"a": 1, "a": 2}') = idem_intent_hash('{"a": 2}') AS last_duplicate_wins,
       idem_intent_hash('{"n": 1.0}') = idem_intent_hash('{"n": 1}') AS scale_ignored,
       idem_intent_hash('{"n": 1e2}') = idem_intent_hash('{"n": 100}') AS exponent_ignored,
       idem_intent_hash('{"b": 1}') = sha256(convert_to('{"b": 1}'::jsonb::text, 'UTF8')) AS is_sha256_of_text,
       octet_length(idem_intent_hash('{}')) AS bytes;
SELECT rg_try($$SELECT idem_intent_hash(NULL)$$);

--
-- Safe names and object keys
--
SELECT name, idem_attempt_safe_name(name) AS safe,
       idem_attempt_safe_name(idem_attempt_safe_name(name)) = idem_attempt_safe_name(name) AS stable
  FROM unnest(ARRAY['report.pdf', '../../etc/passwd', 'C:\Users\x\Résumé final.docx',
                    '.env', 'my file (1).PDF', '日本語.txt', 'trailing.', 'a__b  c',
                    '-x-', repeat('n', 150) || '.pdf', repeat('n', 150) || '.' || repeat('e', 20),
                    repeat('n', 99) || '..x']) AS name;
SELECT octet_length(idem_attempt_safe_name(repeat('n', 150) || '.pdf')) AS cut_length;
SELECT name, rg_try(format('SELECT idem_attempt_safe_name(%L)', name))
  FROM unnest(ARRAY['', '...', 'dir/', '\']) AS name;

SELECT idem_attempt_object_key('orders', 'case/7', '00000000-0000-4000-8000-000000000001', 3,
                               'Scan 2024 (final).PDF');
SELECT target, rg_try(format($$SELECT idem_attempt_object_key('orders', %L,
                             '00000000-0000-4000-8000-000000000001', 1, 'a')$$, target))
  FROM unnest(ARRAY['case//7', '../x', 'case/7/', 'case/./7', 'a b', '', repeat('t', 513)]) AS target;
SELECT rg_try($$SELECT idem_attempt_object_key('orders', 'c', '00000000-0000-4000-8000-000000000001', 0, 'a')$$);
SELECT rg_try($$SELECT idem_attempt_object_key('orders', 'c', NULL, 1, 'a')$$);
SELECT rg_try($$SELECT idem_attempt_object_key('orders', 'c', '00000000-0000-4000-8000-000000000001', 1, NULL)$$);

--
-- The decision table
--
-- new: pending, generation 1, the key of g1
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"name": "scan.pdf", "size": 3}',
                      'scan.pdf', sha256('abc'));
-- same intent, whatever its key order: resume, the next step is the upload
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"size": 3, "name": "scan.pdf"}',
                      'scan.pdf', sha256('abc'));
-- another creator: forbidden, and nothing about the attempt is revealed
SELECT * FROM idem_attempt_open('rg_file', 'case/1', 'r-new', 'mallory', '{"name": "scan.pdf", "size": 3}');
-- another intent: mismatch, nothing written
SELECT updated_at AS before_mismatch FROM idem_attempts WHERE attempt_id = rg_id('r-new') \gset
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"name": "scan.pdf", "size": 4}');
-- another declared digest: mismatch too
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"size": 3, "name": "scan.pdf"}',
                      'scan.pdf', sha256('abd'));
SELECT updated_at = :'before_mismatch' AS untouched, status, generation
  FROM idem_attempts WHERE attempt_id = rg_id('r-new');
-- the same request id on another target or kind is another attempt
SELECT decision FROM rg_open('rg_file', 'case/2', 'r-new', 'alice', '{"name": "scan.pdf", "size": 3}');
SELECT decision FROM rg_open('rg_order', 'case/1', 'r-new', 'alice', '{"name": "scan.pdf", "size": 3}');
DELETE FROM idem_attempts WHERE client_request_id = 'r-new' AND (kind, target) <> ('rg_file', 'case/1');

-- stored: resume, the next step is the promotion
SELECT idem_attempt_store(rg_id('r-new'), 1, sha256('abc')) AS stored;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"name": "scan.pdf", "size": 3}');
-- promoted: the promoted attempt is the current one
SELECT idem_attempt_promote(rg_id('r-new'), 1, sha256('abc')) AS promoted;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-new', 'alice', '{"name": "scan.pdf", "size": 3}');
SELECT * FROM rg_state('r-new');

-- failed(reaped_no_blob): reopened under generation 2, the key rotates
SELECT decision FROM rg_open('rg_file', 'case/1', 'r-reap', 'alice', '{"name": "a.txt"}', 'a.txt');
SELECT idem_attempt_fail(rg_id('r-reap'), 1, 'reaped_no_blob') AS reaped;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-reap', 'alice', '{"name": "a.txt"}', 'a.txt');
SELECT * FROM rg_open('rg_file', 'case/1', 'r-reap', 'alice', '{"name": "a.txt"}', 'a.txt');

-- failed(digest_mismatch): reopened as well
SELECT decision FROM rg_open('rg_file', 'case/1', 'r-digest', 'alice', '{"name": "b.txt"}', 'b.txt', sha256('b'));
SELECT idem_attempt_fail(rg_id('r-digest'), 1, 'digest_mismatch') AS mismatched;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-digest', 'alice', '{"name": "b.txt"}', 'b.txt', sha256('b'));

-- failed(target_gone): gone (the caller answers 404)
SELECT decision FROM rg_open('rg_file', 'case/1', 'r-gone', 'alice', '{"name": "c.txt"}', 'c.txt', sha256('c'));
SELECT idem_attempt_store(rg_id('r-gone'), 1, sha256('c')) AS stored;
SELECT idem_attempt_fail(rg_id('r-gone'), 1, 'target_gone') AS gone;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-gone', 'alice', '{"name": "c.txt"}', 'c.txt');

-- superseded (replace kind): the newer promoted attempt is the current one
SELECT decision FROM rg_open('rg_order', 'order/9', 'r-old', 'alice', '{"v": 1}', 'order.pdf', sha256('v1'));
SELECT decision FROM rg_open('rg_order', 'order/9', 'r-newer', 'alice', '{"v": 2}', 'order.pdf', sha256('v2'));
SELECT idem_attempt_store(rg_id('r-old'), 1, sha256('v1')) AND
       idem_attempt_promote(rg_id('r-old'), 1, sha256('v1')) AS old_promoted;
SELECT current_attempt_id = rg_id('r-old') AS old_is_current
  FROM idem_attempt_targets WHERE kind = 'rg_order' AND target = 'order/9';
SELECT idem_attempt_store(rg_id('r-newer'), 1, sha256('v2')) AND
       idem_attempt_promote(rg_id('r-newer'), 1, sha256('v2')) AS newer_promoted;
SELECT * FROM rg_open('rg_order', 'order/9', 'r-old', 'alice', '{"v": 1}');
SELECT * FROM rg_open('rg_order', 'order/9', 'r-newer', 'alice', '{"v": 2}');
SELECT * FROM rg_state('r-old');
SELECT idem_attempt_current('rg_order', 'order/9') = rg_id('r-newer') AS newer_is_current,
       idem_attempt_current('rg_order', 'order/none') IS NULL AS none_for_unknown_target;

-- An older attempt promoted after a newer one: promoted and superseded at
-- once, the pointer stays on the (created_at, attempt_id) winner.
SELECT decision FROM rg_open('rg_order', 'order/10', 'r-first', 'alice', '{"v": 1}', 'o.pdf', sha256('f'));
SELECT decision FROM rg_open('rg_order', 'order/10', 'r-second', 'alice', '{"v": 2}', 'o.pdf', sha256('s'));
SELECT idem_attempt_store(rg_id('r-second'), 1, sha256('s')) AND
       idem_attempt_promote(rg_id('r-second'), 1, sha256('s')) AS second_promoted;
SELECT idem_attempt_store(rg_id('r-first'), 1, sha256('f')) AND
       idem_attempt_promote(rg_id('r-first'), 1, sha256('f')) AS first_promoted;
SELECT * FROM rg_state('r-first');
SELECT idem_attempt_current('rg_order', 'order/10') = rg_id('r-second') AS second_is_current;
-- both promotions staged their events; the late one says who is current
SELECT o.topic, o.message_key, o.payload ->> 'status' AS status,
       o.payload ->> 'current_attempt_id' = rg_id('r-second')::text AS names_winner
  FROM idem_outbox o JOIN idem_attempts a ON a.event_id = o.id
 WHERE a.attempt_id IN (rg_id('r-first'), rg_id('r-second'))
 ORDER BY o.id;

-- pruned: the row is gone, so the same request starts afresh
UPDATE idem_attempts SET updated_at = updated_at - interval '32 days'
 WHERE attempt_id = rg_id('r-gone');
SELECT idem_attempt_swept(rg_id('r-gone'), 1) AS swept;
SELECT idem_attempt_prune('31 days', 100) AS pruned;
SELECT * FROM rg_open('rg_file', 'case/1', 'r-gone', 'alice', '{"name": "c.txt"}', 'c.txt');

-- bad arguments
SELECT rg_try($$SELECT idem_attempt_open('rg_nope', 'case/1', 'r', 'alice', '{}')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', '[1]')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', 'null')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', NULL)$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', NULL, 'alice', '{}')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', '', 'alice', '{}')$$);
SELECT rg_try(format($$SELECT idem_attempt_open('rg_file', 'case/1', %L, 'alice', '{}')$$, repeat('r', 256)));
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', '', '{}')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', '../etc', 'r', 'alice', '{}')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', '{}', NULL)$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', '{}', '..')$$);
SELECT rg_try($$SELECT idem_attempt_open('rg_file', 'case/1', 'r', 'alice', '{}', 'f', '\x00')$$);
SELECT count(*) AS nothing_written FROM idem_attempts WHERE client_request_id = 'r';

--
-- Transitions.  A stale generation, or a state that comes after the
-- expected one, changes nothing and answers false (NULL for reopen).
--
SELECT decision FROM rg_open('rg_file', 'case/3', 'r-t', 'alice', '{"t": 1}', 't.bin', sha256('t'));
SELECT idem_attempt_store(rg_id('r-t'), 2, sha256('t')) AS store_wrong_generation,
       idem_attempt_fail(rg_id('r-t'), 2, 'reaped_no_blob') AS fail_wrong_generation,
       idem_attempt_reopen(rg_id('r-t'), 2) AS reopen_wrong_generation;
-- the declared digest is checked: a store with another digest raises
SELECT rg_try($$SELECT idem_attempt_store(rg_id('r-t'), 1, sha256('other'))$$);
SELECT idem_attempt_store(rg_id('r-t'), 1, sha256('t')) AS store;
SELECT idem_attempt_store(rg_id('r-t'), 1, sha256('t')) AS store_again,
       idem_attempt_fail(rg_id('r-t'), 1, 'reaped_no_blob') AS reap_after_store,
       idem_attempt_fail(rg_id('r-t'), 1, 'digest_mismatch') AS mismatch_after_store;
-- never promote on bare existence: the verified digest must be the declared one
SELECT rg_try($$SELECT idem_attempt_promote(rg_id('r-t'), 1, sha256('other'))$$);
SELECT * FROM rg_state('r-t');
SELECT idem_attempt_promote(rg_id('r-t'), 1, sha256('t'), 'rg.custom', '{"note": "hi", "attempt_id": "forged"}') AS promote;
SELECT idem_attempt_promote(rg_id('r-t'), 1, sha256('t')) AS promote_again,
       idem_attempt_fail(rg_id('r-t'), 1, 'target_gone') AS gone_after_promote,
       idem_attempt_store(rg_id('r-t'), 1, sha256('t')) AS store_after_promote;
SELECT o.topic, o.message_key, o.payload ->> 'note' AS note,
       o.payload ->> 'attempt_id' = rg_id('r-t')::text AS names_attempt,
       o.payload -> 'intent' AS intent, o.payload ->> 'generation' AS generation
  FROM idem_outbox o JOIN idem_attempts a ON a.event_id = o.id
 WHERE a.attempt_id = rg_id('r-t');

-- an export declares its digest when it stores
SELECT * FROM rg_open('rg_file', 'case/3', 'r-export', 'alice', '{"export": "2024-01", "generated_on": "2024-02-01"}', 'export.csv');
SELECT idem_attempt_store(rg_id('r-export'), 1, sha256('rows')) AS stored;
SELECT declared_digest = sha256('rows') AS declared FROM idem_attempts WHERE attempt_id = rg_id('r-export');

-- failures from pending and stored, each with its event
SELECT decision FROM rg_open('rg_file', 'case/3', 'r-f1', 'alice', '{}', 'f', sha256('f'));
SELECT decision FROM rg_open('rg_file', 'case/3', 'r-f2', 'alice', '{}', 'f', sha256('f'));
SELECT idem_attempt_fail(rg_id('r-f1'), 1, 'target_gone', '{"by": "handler"}') AS pending_gone;
SELECT idem_attempt_store(rg_id('r-f2'), 1, sha256('f')) AS stored;
SELECT idem_attempt_fail(rg_id('r-f2'), 1, 'target_gone') AS stored_gone;
SELECT o.topic, o.message_key, o.payload ->> 'reason' AS reason, o.payload ->> 'by' AS by,
       o.payload ->> 'status' AS status
  FROM idem_outbox o
 WHERE o.payload ->> 'attempt_id' IN (rg_id('r-f1')::text, rg_id('r-f2')::text, rg_id('r-reap')::text)
 ORDER BY o.id;
SELECT rg_try($$SELECT idem_attempt_fail(rg_id('r-f1'), 1, 'crashed')$$);
SELECT rg_try($$SELECT idem_attempt_fail(rg_id('r-f1'), 1, NULL)$$);
SELECT rg_try($$SELECT idem_attempt_fail(rg_id('r-f1'), 0, 'target_gone')$$);
SELECT rg_try($$SELECT idem_attempt_fail('00000000-0000-4000-8000-00000000dead', 1, 'target_gone')$$);
SELECT rg_try($$SELECT idem_attempt_store(rg_id('r-f1'), 1, '\x01')$$);
SELECT rg_try($$SELECT idem_attempt_promote(rg_id('r-f1'), 1, NULL)$$);
SELECT rg_try($$SELECT idem_attempt_promote(rg_id('r-f1'), 1, sha256('f'), '', NULL)$$);
SELECT rg_try($$SELECT idem_attempt_promote(rg_id('r-f1'), 1, sha256('f'), NULL, '"x"')$$);

-- reopen by id; the generation and key move on together
SELECT decision FROM rg_open('rg_file', 'case/3', 'r-re', 'alice', '{}', 'r.bin', sha256('r'));
SELECT idem_attempt_fail(rg_id('r-re'), 1, 'reaped_no_blob') AS reaped;
SELECT idem_attempt_reopen(rg_id('r-re'), 1) AS new_generation;
SELECT idem_attempt_reopen(rg_id('r-re'), 1) AS stale_reopen;
SELECT * FROM rg_state('r-re');
SELECT idem_attempt_store(rg_id('r-re'), 1, sha256('r')) AS late_put_of_g1,
       idem_attempt_store(rg_id('r-re'), 2, sha256('r')) AS put_of_g2;

-- Illegal: the transition can never follow the state the attempt is in.
-- Attempts with fixed ids, so that the messages can be shown whole.
INSERT INTO idem_attempts (attempt_id, kind, target, client_request_id, created_by,
                           intent, intent_hash, object_name, object_key, declared_digest,
                           status, failure_reason)
SELECT ('00000000-0000-4000-8000-00000000000' || n)::uuid, 'rg_file', 'case/4', 'r-fixed-' || n,
       'alice', '{}', idem_intent_hash('{}'), 'x',
       idem_attempt_object_key('cases/files', 'case/4', ('00000000-0000-4000-8000-00000000000' || n)::uuid, 1, 'x'),
       sha256('x'), s, r
  FROM (VALUES (1, 'pending', NULL), (2, 'failed', 'reaped_no_blob'),
               (3, 'failed', 'target_gone'), (4, 'stored', NULL)) AS v(n, s, r);
SELECT idem_attempt_promote('00000000-0000-4000-8000-000000000001', 1, sha256('x'));
SELECT idem_attempt_promote('00000000-0000-4000-8000-000000000002', 1, sha256('x'));
SELECT idem_attempt_reopen('00000000-0000-4000-8000-000000000003', 1);
SELECT idem_attempt_reopen('00000000-0000-4000-8000-000000000004', 1);
SELECT idem_attempt_reopen('00000000-0000-4000-8000-000000000001', 1);

-- The guard trigger holds the same table for any UPDATE.  For each state,
-- the states a direct UPDATE may move it to (the rest raise IL005):
CREATE FUNCTION rg_direct(from_status text, from_reason text, to_status text, to_reason text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    id uuid := '00000000-0000-4000-8000-0000000000aa';
BEGIN
    INSERT INTO idem_attempts (attempt_id, kind, target, client_request_id, created_by,
                               intent, intent_hash, object_name, object_key, declared_digest,
                               status, failure_reason, superseded_by)
    VALUES (id, 'rg_file', 'case/5', 'r-matrix', 'alice', '{}', idem_intent_hash('{}'), 'x', 'k',
            sha256('x'), from_status, from_reason,
            CASE WHEN from_status = 'superseded' THEN id END);
    BEGIN
        UPDATE idem_attempts
           SET status = to_status, failure_reason = to_reason,
               generation = generation + (from_status = 'failed' AND to_status = 'pending')::int,
               superseded_by = CASE WHEN to_status = 'superseded' THEN id END
         WHERE attempt_id = id;
        RAISE EXCEPTION 'legal' USING ERRCODE = 'P0001';
    EXCEPTION
        WHEN SQLSTATE 'IL005' THEN
            DELETE FROM idem_attempts WHERE attempt_id = id;
            RETURN 'illegal';
        WHEN raise_exception THEN
            DELETE FROM idem_attempts WHERE attempt_id = id;
            RETURN 'legal';
    END;
END $$;

WITH states(s, r) AS (
    VALUES ('pending', NULL), ('stored', NULL), ('promoted', NULL), ('superseded', NULL),
           ('failed', 'reaped_no_blob'), ('failed', 'digest_mismatch'), ('failed', 'target_gone'))
SELECT f.s || COALESCE('(' || f.r || ')', '') AS from_state,
       string_agg(t.s || COALESCE('(' || t.r || ')', ''), ', ' ORDER BY t.s, t.r)
           FILTER (WHERE rg_direct(f.s, f.r, t.s, t.r) = 'legal') AS may_become
  FROM states f CROSS JOIN states t
 WHERE (f.s, COALESCE(f.r, '')) <> (t.s, COALESCE(t.r, ''))
 GROUP BY f.s, f.r
 ORDER BY min(array_position(ARRAY['pending', 'stored', 'promoted', 'superseded', 'failed'], f.s)), f.r;

-- what an illegal direct write is told, and the generation and identity rules
UPDATE idem_attempts SET status = 'pending' WHERE attempt_id = '00000000-0000-4000-8000-000000000003';
UPDATE idem_attempts SET status = 'pending', failure_reason = NULL
 WHERE attempt_id = '00000000-0000-4000-8000-000000000002';
UPDATE idem_attempts SET generation = 7 WHERE attempt_id = '00000000-0000-4000-8000-000000000001';
UPDATE idem_attempts SET intent = '{"x": 1}' WHERE attempt_id = '00000000-0000-4000-8000-000000000001';
UPDATE idem_attempts SET created_by = 'mallory' WHERE attempt_id = '00000000-0000-4000-8000-000000000001';

--
-- A promotion cannot commit without its outbox event (IL006).
--
BEGIN;
UPDATE idem_attempts SET status = 'promoted' WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
COMMIT;
BEGIN;
UPDATE idem_attempts SET status = 'promoted', event_id = -1
 WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
COMMIT;
BEGIN;
UPDATE idem_attempts SET status = 'promoted',
       event_id = idem_outbox_stage('rg_file.promoted', '{"attempt_id": "someone-else"}'::jsonb, 'rg_file/case/4')
 WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
COMMIT;
SELECT status FROM idem_attempts WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
-- checked at the statement with SET CONSTRAINTS ... IMMEDIATE as well
BEGIN;
UPDATE idem_attempts SET status = 'promoted' WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
SET CONSTRAINTS idem_attempts_promotion_published IMMEDIATE;
ROLLBACK;
-- a hand-written promotion with an event naming the attempt commits
BEGIN;
UPDATE idem_attempts SET status = 'promoted',
       event_id = idem_outbox_stage('rg_file.promoted',
                                    '{"attempt_id": "00000000-0000-4000-8000-000000000004"}'::jsonb, 'rg_file/case/4')
 WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
COMMIT;
SELECT status FROM idem_attempts WHERE attempt_id = '00000000-0000-4000-8000-000000000004';
-- and its event cannot be taken away afterwards
UPDATE idem_attempts SET event_id = NULL WHERE attempt_id = '00000000-0000-4000-8000-000000000004';

--
-- The replace-kind pointer never goes NULL and never moves back.
--
SELECT rg_try($$UPDATE idem_attempt_targets SET current_attempt_id = NULL
                 WHERE kind = 'rg_order' AND target = 'order/10'$$);
SELECT rg_try($$UPDATE idem_attempt_targets SET current_attempt_id = rg_id('r-first'),
                       current_created_at = (SELECT created_at FROM idem_attempts
                                              WHERE attempt_id = rg_id('r-first'))
                 WHERE kind = 'rg_order' AND target = 'order/10'$$);
UPDATE idem_attempt_targets SET target = 'order/11' WHERE kind = 'rg_order' AND target = 'order/10';
SELECT idem_attempt_current('rg_order', 'order/10') = rg_id('r-second') AS still_second;

--
-- The reconciler's side
--
-- Attempts idle for longer than the grace, pending or stored, locked for the
-- caller's transaction; checked_at keeps one that stays put from coming
-- back before another grace period.
DELETE FROM idem_attempts WHERE kind LIKE 'rg\_%' AND client_request_id LIKE 'r-fixed-%';
UPDATE idem_attempts SET updated_at = updated_at - interval '2 hours'
 WHERE kind LIKE 'rg\_%' AND status IN ('pending', 'stored');
SELECT a.client_request_id, b.status, b.mode, b.generation,
       replace(b.object_key, b.attempt_id::text, '<id>') AS object_key,
       b.declared_digest = a.declared_digest AS digest_given
  FROM idem_attempt_reconcile_batch('1 hour', 100) b
  JOIN idem_attempts a USING (attempt_id)
 WHERE b.kind LIKE 'rg\_%'
 ORDER BY a.client_request_id;
SELECT count(*) AS checked_again_too_soon FROM idem_attempt_reconcile_batch('1 hour', 100)
 WHERE kind LIKE 'rg\_%';
SELECT count(*) AS batch_of_one FROM idem_attempt_reconcile_batch('0', 1);
SELECT rg_try($$SELECT * FROM idem_attempt_reconcile_batch('-1 second', 10)$$);
SELECT rg_try($$SELECT * FROM idem_attempt_reconcile_batch('1 hour', 0)$$);
SELECT rg_try($$SELECT * FROM idem_attempt_reconcile_batch(NULL, 10)$$);

-- Abandoned generations: every one before the current, and the current one
-- of a failed attempt.  r-reap and r-digest were reopened (g1 abandoned);
-- r-f1 and r-f2 failed (g1 abandoned); r-new's only key is live.
SELECT a.client_request_id, s.generation,
       replace(s.object_key, s.attempt_id::text, '<id>') AS object_key
  FROM idem_attempt_sweep_batch('0', 100) s JOIN idem_attempts a USING (attempt_id)
 WHERE a.kind LIKE 'rg\_%'
 ORDER BY a.client_request_id, s.generation;
SELECT idem_attempt_swept(rg_id('r-reap'), 1) AS swept,
       idem_attempt_swept(rg_id('r-reap'), 1) AS swept_again;
SELECT rg_try($$SELECT idem_attempt_swept(rg_id('r-reap'), 2)$$);
SELECT count(*) AS r_reap_left FROM idem_attempt_sweep_batch('0', 100) WHERE attempt_id = rg_id('r-reap');

-- Pruning: finished, idle past the retention, and swept.
UPDATE idem_attempts SET updated_at = updated_at - interval '40 days'
 WHERE kind LIKE 'rg\_%' AND client_request_id IN ('r-f1', 'r-f2', 'r-old', 'r-new');
SELECT idem_attempt_prune('31 days', 100) AS pruned;   -- r-old and r-new: nothing to sweep
SELECT status FROM rg_state('r-f1');                    -- kept until swept
SELECT idem_attempt_swept(rg_id('r-f1'), 1) AND idem_attempt_swept(rg_id('r-f2'), 1) AS swept;
SELECT idem_attempt_prune('31 days', 1) AS pruned, idem_attempt_prune('31 days', 1) AS pruned_next,
       idem_attempt_prune('31 days', 1) AS nothing_left;
SELECT rg_try($$SELECT idem_attempt_prune('-1 day', 10)$$);
SELECT rg_try($$SELECT idem_attempt_prune('31 days', 2000000)$$);

--
-- Clean up
--
DELETE FROM idem_outbox WHERE message_key LIKE 'rg\_%';
DELETE FROM idem_attempt_targets WHERE kind LIKE 'rg\_%';
DELETE FROM idem_attempts WHERE kind LIKE 'rg\_%';
DELETE FROM idem_attempt_kinds WHERE kind LIKE 'rg\_%';
DROP FUNCTION rg_direct(text, text, text, text);
DROP FUNCTION rg_state(text);
DROP FUNCTION rg_gen(text);
DROP FUNCTION rg_id(text);
DROP FUNCTION rg_open(text, text, text, text, jsonb, text, bytea);
DROP FUNCTION rg_try(text);
