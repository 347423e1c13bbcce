-- Pins a fix from the second review of the direct path (table/direct_table.c direct_insert/direct_update): statement-level
-- AFTER triggers fire, but with no transition capture
-- (ExecARInsertTriggers/ExecASInsertTriggers get NULL): a DBA's trigger
-- with REFERENCING NEW TABLE makes every stage fail ("relation ... does
-- not exist") where 0.3.0's INSERT gave it the statement's rows.
-- Expected: the stages succeed and the trigger counts 1, then 3 rows.

CREATE TABLE regress_new_rows_log(n bigint);
CREATE FUNCTION regress_count_new_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.regress_new_rows_log SELECT count(*) FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER regress_count_new_rows AFTER INSERT ON idem_outbox_queue
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION regress_count_new_rows();

SELECT idem_outbox_stage('transition_table', '{}'::jsonb) > 0 AS staged;
SELECT count(*) AS staged FROM idem_outbox_stage_batch('transition_table', ARRAY['{}', '{}', '{}']::jsonb[]);
SELECT n FROM regress_new_rows_log ORDER BY n;

DROP TRIGGER regress_count_new_rows ON idem_outbox_queue;
DROP FUNCTION regress_count_new_rows();
DROP TABLE regress_new_rows_log;
DELETE FROM idem_outbox_queue WHERE topic = 'transition_table';
