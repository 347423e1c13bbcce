-- Pins a fix from the second review of the direct path (table/direct_table.c direct_insert/direct_update): statement-level
-- AFTER triggers fire, but with no transition capture
-- (ExecARInsertTriggers/ExecASInsertTriggers get NULL): a DBA's trigger
-- with REFERENCING NEW TABLE makes every stage fail ("relation ... does
-- not exist") where 0.3.0's INSERT gave it the statement's rows.
-- Expected: the stages succeed and the trigger counts 1, then 3 rows.

CREATE TABLE regress_review13b_tt_log(n bigint);
CREATE FUNCTION regress_review13b_tt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.regress_review13b_tt_log SELECT count(*) FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER regress_review13b_tt AFTER INSERT ON idem_outbox_queue
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION regress_review13b_tt();

SELECT idem_outbox_stage('review13b_tt', '{}'::jsonb) > 0 AS staged;
SELECT count(*) AS staged FROM idem_outbox_stage_batch('review13b_tt', ARRAY['{}', '{}', '{}']::jsonb[]);
SELECT n FROM regress_review13b_tt_log ORDER BY n;

DROP TRIGGER regress_review13b_tt ON idem_outbox_queue;
DROP FUNCTION regress_review13b_tt();
DROP TABLE regress_review13b_tt_log;
DELETE FROM idem_outbox_queue WHERE topic = 'review13b_tt';
