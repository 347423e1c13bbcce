-- Pins a fix from the review of the direct path (keys/key_table.c, install/90_privileges.sql): the hot path is
-- SECURITY INVOKER without a pinned search_path and switches to the
-- table's owner in C around the table access; triggers on idem_keys fire
-- inside that window (ExecBRInsertTriggers, and AfterTriggerEndQuery in
-- key_table_close), so they run as the owner (a superuser) with the
-- *caller's* search_path.  A client role that puts its own schema before
-- pg_catalog has its operator chosen for the "=" of an ordinary audit
-- trigger and runs it as the superuser.  0.3.0 fired them inside a
-- SECURITY DEFINER function with search_path = pg_catalog, pg_temp (issue
-- 12's guarantee: nothing the extension runs may resolve to a planted
-- object).

CREATE ROLE regress_path_claimer LOGIN;
GRANT idem_client TO regress_path_claimer;
CREATE SCHEMA path_claimer_schema AUTHORIZATION regress_path_claimer;

-- An operator's audit trigger on idem_keys, written without a pinned path.
CREATE TABLE public.completed_keys_audit (cache_key bytea, state text);
CREATE FUNCTION public.completed_keys_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'completed' THEN
        INSERT INTO public.completed_keys_audit VALUES (NEW.cache_key, NEW.state);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER completed_keys_audit AFTER INSERT OR UPDATE ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.completed_keys_audit();

SET ROLE regress_path_claimer;
CREATE TABLE path_claimer_schema.ran (as_user name);
CREATE FUNCTION path_claimer_schema.planted_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO path_claimer_schema.ran VALUES (current_user);
    BEGIN
        EXECUTE 'ALTER ROLE regress_path_claimer SUPERUSER';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
    RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE OPERATOR path_claimer_schema.= (LEFTARG = text, RIGHTARG = text, FUNCTION = path_claimer_schema.planted_eq);
SET search_path = path_claimer_schema, pg_catalog, public;
SELECT outcome FROM public.idem_claim(public.idem_key('trigger_search_path', 'POST', '/sp', 'k1'),
                                      public.idem_request_hash('x'), '1 hour');
RESET search_path;
RESET ROLE;

SELECT count(*) FILTER (WHERE as_user <> 'regress_path_claimer') AS planted_ran_as_another_role
  FROM path_claimer_schema.ran;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_path_claimer';

DROP TRIGGER completed_keys_audit ON idem_keys;
DROP FUNCTION public.completed_keys_audit();
DROP TABLE public.completed_keys_audit;
DELETE FROM idem_keys WHERE cache_key = idem_key('trigger_search_path', 'POST', '/sp', 'k1');
DROP SCHEMA path_claimer_schema CASCADE;
DROP ROLE regress_path_claimer;
