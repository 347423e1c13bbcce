-- Pins a fix from the second review of the direct path (table/direct_table.c build/prepare_defaults): the kept state is
-- rebuilt in direct_open after the switch to the table's owner but before
-- the search_path pin.  prepare_defaults' ExecPrepareExpr runs
-- expression_planner, which inlines a SQL-language default function and
-- parses its body with the caller's search_path: a role allowed to stage
-- (idem_client) puts its own schema first and gets its function run as
-- the table's owner (the superuser who created the extension).  0.3.0's
-- SECURITY DEFINER ... SET search_path planned the INSERT under the pin.
-- Expected: no NOTICE from the role's function, note = 'dba'.

CREATE ROLE regress_path_stager LOGIN;
GRANT idem_client TO regress_path_stager;
CREATE SCHEMA regress_path_stager_schema AUTHORIZATION regress_path_stager;
CREATE FUNCTION public.regress_default_note() RETURNS text
    LANGUAGE sql VOLATILE AS $$ SELECT lower('DBA') $$;
ALTER TABLE idem_outbox_queue ADD COLUMN regress_default_note text
    DEFAULT public.regress_default_note();

SET ROLE regress_path_stager;
CREATE FUNCTION regress_path_stager_schema.lower(text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'role''s function runs as superuser: %', (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
    RETURN 'hijacked';
END $$;
SET search_path = regress_path_stager_schema, pg_catalog, public;
SELECT idem_outbox_stage('default_under_pin', '{}'::jsonb) > 0 AS staged;
RESET search_path;
RESET ROLE;

SELECT regress_default_note AS note FROM idem_outbox_queue WHERE topic = 'default_under_pin';

DELETE FROM idem_outbox_queue WHERE topic = 'default_under_pin';
ALTER TABLE idem_outbox_queue DROP COLUMN regress_default_note;
DROP FUNCTION public.regress_default_note();
DROP FUNCTION regress_path_stager_schema.lower(text);
DROP SCHEMA regress_path_stager_schema;
DROP ROLE regress_path_stager;
