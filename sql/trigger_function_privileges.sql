-- Pins a review finding: idem_client may attach idem_version_guard to its own
-- tables, and nothing else.  The extension's other trigger functions read
-- their table's columns by position or name with fixed types (and
-- idem_attempts_promotion_published runs as the extension's owner):
-- attached to a table of the caller's making they crashed the server.

CREATE ROLE regress_review_app LOGIN;
GRANT idem_client TO regress_review_app;
CREATE SCHEMA review_app AUTHORIZATION regress_review_app;

SET ROLE regress_review_app;
CREATE TABLE review_app.mine (attempt_id bigint, version bigint NOT NULL DEFAULT 1, x int);
CREATE TRIGGER mine_version BEFORE INSERT OR UPDATE ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
CREATE TRIGGER t1 AFTER UPDATE ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_attempts_promotion_published();
CREATE TRIGGER t2 AFTER INSERT ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_keys_claim_finished();
CREATE TRIGGER t3 AFTER INSERT ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_inbox_message_done();
CREATE TRIGGER t4 BEFORE UPDATE ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_attempts_transition_guard();
CREATE TRIGGER t5 BEFORE UPDATE ON review_app.mine
    FOR EACH ROW EXECUTE FUNCTION idem_attempt_targets_guard();
INSERT INTO review_app.mine (attempt_id, x) VALUES (1, 1);
UPDATE review_app.mine SET x = 2, version = 1;
SELECT attempt_id, version, x FROM review_app.mine;
RESET ROLE;

SELECT p.proname, has_function_privilege('idem_client', p.oid, 'EXECUTE') AS client_may_use
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idem') AND d.deptype = 'e'
   AND p.prorettype = 'trigger'::regtype
 ORDER BY 1;

DROP SCHEMA review_app CASCADE;
DROP ROLE regress_review_app;
