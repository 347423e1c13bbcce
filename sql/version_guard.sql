-- The row-version guard, and the write patterns it goes with: If-Match
-- optimistic concurrency, status pins, first-write-wins, and "an event
-- only on a real change".  Each block is a README example.
\set SHOW_CONTEXT never

--
-- 1. If-Match optimistic concurrency
--
CREATE TABLE vg_docs (
    id      integer PRIMARY KEY,
    body    text    NOT NULL,
    version bigint  NOT NULL DEFAULT 1
);
CREATE TRIGGER vg_docs_version BEFORE INSERT OR UPDATE ON vg_docs
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();

INSERT INTO vg_docs (id, body) VALUES (1, 'draft') RETURNING version;
-- GET returns ETag "1"; PUT with If-Match: "1" writes and gets ETag "2"
UPDATE vg_docs SET body = 'first edit', version = 1 WHERE id = 1 RETURNING body, version;
-- a second PUT with the same If-Match: "1" is stale (HTTP 412), nothing written
UPDATE vg_docs SET body = 'lost update', version = 1 WHERE id = 1 RETURNING body, version;
SELECT body, version FROM vg_docs WHERE id = 1;
-- a write that does not state a version is unconditional, and still bumps
UPDATE vg_docs SET body = 'admin fix' WHERE id = 1 RETURNING body, version;
-- an explicit version on INSERT is kept (copies and restores); NULL is refused
INSERT INTO vg_docs (id, body, version) VALUES (2, 'copied', 41) RETURNING version;
UPDATE vg_docs SET version = NULL WHERE id = 2;
-- a DELETE states its version in the WHERE clause: 0 rows means stale or gone
DELETE FROM vg_docs WHERE id = 2 AND version = 40 RETURNING id;
DELETE FROM vg_docs WHERE id = 2 AND version = 41 RETURNING id;

-- The column may be named, and be integer or smallint.
CREATE TABLE vg_rules (name text PRIMARY KEY, revision smallint NOT NULL DEFAULT 1);
CREATE TRIGGER vg_rules_revision BEFORE INSERT OR UPDATE ON vg_rules
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard('revision');
INSERT INTO vg_rules VALUES ('r1', 32766);
UPDATE vg_rules SET revision = 32766 WHERE name = 'r1' RETURNING revision;
UPDATE vg_rules SET revision = 32767 WHERE name = 'r1';

-- Misuse is refused clearly.
CREATE TABLE vg_bad (id integer, version text, v2 bigint);
CREATE TRIGGER vg_bad_text BEFORE UPDATE ON vg_bad
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
INSERT INTO vg_bad VALUES (1, 'x', 1);
UPDATE vg_bad SET id = 2;
DROP TRIGGER vg_bad_text ON vg_bad;
CREATE TRIGGER vg_bad_missing BEFORE UPDATE ON vg_bad
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard('nope');
UPDATE vg_bad SET id = 2;
DROP TRIGGER vg_bad_missing ON vg_bad;
CREATE TRIGGER vg_bad_after AFTER UPDATE ON vg_bad
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard('v2');
UPDATE vg_bad SET id = 2;
DROP TRIGGER vg_bad_after ON vg_bad;
CREATE TRIGGER vg_bad_args BEFORE UPDATE ON vg_bad
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard('v2', 'extra');
UPDATE vg_bad SET id = 2;
DROP TRIGGER vg_bad_args ON vg_bad;
SELECT idem_version_guard();

--
-- 2. Status pins: the transition states the status it starts from, so a
-- replayed or concurrent "close" cannot re-run it.  0 rows: read the row
-- under the same lock to answer 200 (already closed) or 409 (moved on).
--
CREATE TABLE vg_cases (id integer PRIMARY KEY, status text NOT NULL,
                       closed_reason text, version bigint NOT NULL DEFAULT 1);
CREATE TRIGGER vg_cases_version BEFORE INSERT OR UPDATE ON vg_cases
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
INSERT INTO vg_cases (id, status) VALUES (7, 'open');

UPDATE vg_cases SET status = 'closed', closed_reason = 'resolved'
 WHERE id = 7 AND status = 'open' RETURNING status, version;
-- the retry changes nothing ...
UPDATE vg_cases SET status = 'closed', closed_reason = 'resolved'
 WHERE id = 7 AND status = 'open' RETURNING status, version;
-- ... and the row already embodies the request: 200, not a second closure
SELECT CASE WHEN status = 'closed' AND closed_reason = 'resolved' THEN 200 ELSE 409 END AS http
  FROM vg_cases WHERE id = 7 FOR UPDATE;

--
-- 3. First write wins: an approval stamp is set once; a later approver
-- neither overwrites it nor gets an error.
--
CREATE TABLE vg_agreements (id integer PRIMARY KEY, approved_by text,
                            version bigint NOT NULL DEFAULT 1);
CREATE TRIGGER vg_agreements_version BEFORE INSERT OR UPDATE ON vg_agreements
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
INSERT INTO vg_agreements (id) VALUES (3);
UPDATE vg_agreements SET approved_by = COALESCE(approved_by, 'alice')
 WHERE id = 3 AND approved_by IS NULL RETURNING approved_by, version;
UPDATE vg_agreements SET approved_by = COALESCE(approved_by, 'bob')
 WHERE id = 3 AND approved_by IS NULL RETURNING approved_by, version;
SELECT approved_by, version FROM vg_agreements WHERE id = 3;

--
-- 4. An event only on a real change: the IS DISTINCT FROM gate leaves a
-- repeated PUT without a write, a version bump or an event; the event is
-- staged in the same statement as the change.
--
CREATE TABLE vg_people (id integer PRIMARY KEY, email text,
                        version bigint NOT NULL DEFAULT 1);
CREATE TRIGGER vg_people_version BEFORE INSERT OR UPDATE ON vg_people
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
INSERT INTO vg_people (id, email) VALUES (5, 'old@example.org');

CREATE FUNCTION vg_set_email(person integer, new_email text) RETURNS bigint
LANGUAGE sql AS $$
    WITH changed AS (
        UPDATE vg_people SET email = new_email
         WHERE id = person AND email IS DISTINCT FROM new_email
        RETURNING id, email, version)
    SELECT idem_outbox_stage('vg.person.updated',
                             jsonb_build_object('id', id, 'email', email, 'version', version),
                             'vg.person/' || id)
      FROM changed
$$;
SELECT vg_set_email(5, 'new@example.org') IS NOT NULL AS event_staged;
SELECT vg_set_email(5, 'new@example.org') IS NOT NULL AS event_staged;   -- the same PUT again
SELECT version FROM vg_people WHERE id = 5;
SELECT topic, payload ->> 'email' AS email, payload ->> 'version' AS version
  FROM idem_outbox WHERE message_key = 'vg.person/5' ORDER BY id;

DELETE FROM idem_outbox WHERE message_key LIKE 'vg.%';
DROP FUNCTION vg_set_email(integer, text);
DROP TABLE vg_docs, vg_rules, vg_bad, vg_cases, vg_agreements, vg_people;
