-- pg_idem 0.3.0--0.4.0: frozen as released; never edit (new changes go into the next version's pieces)
\echo Use "CREATE EXTENSION pg_idem" or "ALTER EXTENSION pg_idem UPDATE" to load this file. \quit

-- extension/sql/00_schema_check.sql
-- The target schema: warn when a role that is not a superuser may create
-- objects in it.  Such a role can plant functions and operators next to
-- pg_idem's, and a script or a call that resolves a name through the
-- schema could pick theirs.  pg_idem's own SQL names everything with its
-- schema and exact argument types, but the application's calls are the
-- application's; so the advice is a schema of its own.  A warning, not a
-- refusal: the README's quick start installs into public, which on
-- PostgreSQL 15 the database owner may create in.
DO $schema_check$
DECLARE
    target CONSTANT pg_catalog.oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension e
                                        WHERE e.extname OPERATOR(pg_catalog.=) 'pg_idem'::pg_catalog.name);
    writers pg_catalog.text;
BEGIN
    SELECT pg_catalog.string_agg(w.who, ', '::pg_catalog.text ORDER BY w.who)
      INTO writers
      FROM (SELECT 'PUBLIC'::pg_catalog.text AS who
              FROM pg_catalog.pg_namespace n,
                   pg_catalog.aclexplode(COALESCE(n.nspacl, pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
             WHERE n.oid OPERATOR(pg_catalog.=) target
               AND a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
               AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text
            UNION
            SELECT pg_catalog.quote_ident(r.rolname::pg_catalog.text)
              FROM pg_catalog.pg_roles r
             WHERE NOT r.rolsuper
               AND NOT r.rolname OPERATOR(pg_catalog.~~) 'pg\_%'::pg_catalog.text
               AND pg_catalog.has_schema_privilege(r.oid, target, 'CREATE'::pg_catalog.text)) w;
    IF writers IS NOT NULL THEN
        RAISE WARNING 'schema "%" is writable by roles that are not superusers',
            (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) target)
            USING DETAIL = pg_catalog.format('Roles that may create objects in it: %s.'::pg_catalog.text, writers),
                  HINT = 'Install pg_idem into a schema of its own that only its owner may create in: CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;';
    END IF;
END
$schema_check$;

-- extension/upgrades/0.3.0--0.4.0/00_header.sql
-- 0.3.0 -> 0.4.0, one file per concern (assembled in name order).  Every
-- name is schema-qualified (@extschema@, pg_catalog) and every operator in
-- an expression run by the script is OPERATOR(pg_catalog.op): the script
-- runs as a superuser in a schema other roles may create objects in.
--
-- 0.4.0 changes no table.  The hot paths (idem_claim, idem_begin,
-- idem_lookup, idem_renew, idem_finalize, idem_release, idem_fail,
-- idem_evict, and outbox staging) read and write their tables directly and switch to the
-- table's owner inside C, so those functions lose SECURITY DEFINER and
-- their pinned search_path: the privileges piece (90_privileges.sql, run
-- after this file) resets them.

-- extension/upgrades/0.3.0--0.4.0/40_outbox.sql
-- Staging (idem_outbox_stage, idem_outbox_stage_bytes, idem_outbox_stage_batch)
-- writes idem_outbox_queue directly too; the privileges piece makes those
-- functions SECURITY INVOKER.
COMMENT ON FUNCTION @extschema@.idem_outbox_stage_batch(pg_catalog.text, pg_catalog.jsonb[], pg_catalog.text[], pg_catalog.jsonb[], pg_catalog.interval) IS
    'stage one event per payload in one call, in array order; returns their ids in that order';

-- extension/sql/90_privileges.sql
-- Least privilege.  Runs last, over every function the extension created:
--
--  * PUBLIC gets nothing: no function, table or view of pg_idem is usable
--    until a role is granted idem_client or idem_admin.
--  * idem_client may call the request-path functions only.  It cannot read
--    or write the state tables: cached responses can hold personal data,
--    and a row edited by hand defeats every fence.
--  * idem_admin (a member of idem_client) may also read the operator views
--    and the state tables, evict keys, reset statistics and run cleanups.
--  * Functions that touch the state tables run as the extension's owner
--    (SECURITY DEFINER) with search_path pinned to pg_catalog, pg_temp, so
--    no caller-created operator or function can be resolved inside them.
--    None builds SQL from its arguments.
--  * Except the hot paths (direct_functions: the claims, staging outbox
--    events): those run no SQL text at all (direct_table.c reads and writes
--    idem_keys and idem_outbox_queue directly) and switch
--    to the table's owner in C around the table access, so they need
--    neither definer rights nor a pinned search_path, whose GUC nesting
--    level per call was a measurable part of a claim.
--
-- The roles are cluster-wide: they are created once and kept by DROP
-- EXTENSION (another database may use them).
--
-- The block runs as a superuser with the search_path set to the target
-- schema, which other roles may be able to create in: every function and
-- operator in it is schema-qualified and called with exactly typed
-- arguments, so that no overload of theirs can be chosen.

DO $privileges$
DECLARE
    -- The request path: what an application role needs.
    client_functions CONSTANT pg_catalog.name[] := ARRAY[
        'idem_key', 'idem_request_hash',
        'idem_claim', 'idem_begin', 'idem_lookup', 'idem_renew',
        'idem_finalize', 'idem_release', 'idem_fail',
        'idem_outbox_stage', 'idem_outbox_claim', 'idem_outbox_ack',
        'idem_outbox_nack', 'idem_outbox_wait',
        'idem_outbox_stage_bytes', 'idem_outbox_stage_batch', 'idem_outbox_backlog',
        'idem_outbox_stage_bytes', 'idem_outbox_stage_batch', 'idem_outbox_backlog',
        'idem_inbox_begin', 'idem_inbox_done', 'idem_inbox_fail',
        'idem_attempt_open', 'idem_attempt_object_key', 'idem_attempt_store',
        'idem_attempt_promote', 'idem_attempt_fail', 'idem_attempt_reopen',
        'idem_attempt_safe_name', 'idem_attempt_current', 'idem_intent_hash']::pg_catalog.name[];
    -- The claim hot path: direct table access as the owner, no SQL text.
    direct_functions CONSTANT pg_catalog.name[] := ARRAY[
        'idem_claim', 'idem_begin', 'idem_lookup', 'idem_renew',
        'idem_finalize', 'idem_release', 'idem_fail', 'idem_evict',
        'idem_outbox_stage', 'idem_outbox_stage_bytes',
        'idem_outbox_stage_batch']::pg_catalog.name[];
    -- Pure functions of their arguments: no table, no need for definer rights.
    pure_functions CONSTANT pg_catalog.name[] := ARRAY[
        'idem_key', 'idem_request_hash', 'idem_attempt_object_key',
        'idem_attempt_safe_name', 'idem_intent_hash']::pg_catalog.name[];
    ext_oid pg_catalog.oid := (SELECT e.oid FROM pg_catalog.pg_extension e
                                WHERE e.extname OPERATOR(pg_catalog.=) 'pg_idem'::pg_catalog.name);
    proc_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid;
    class_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid;
    ext_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_extension'::pg_catalog.regclass::pg_catalog.oid;
    trigger_type CONSTANT pg_catalog.oid := 'pg_catalog.trigger'::pg_catalog.regtype::pg_catalog.oid;
    fn record;
    rel record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r
                    WHERE r.rolname OPERATOR(pg_catalog.=) 'idem_client'::pg_catalog.name) THEN
        CREATE ROLE idem_client NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r
                    WHERE r.rolname OPERATOR(pg_catalog.=) 'idem_admin'::pg_catalog.name) THEN
        CREATE ROLE idem_admin NOLOGIN;
    END IF;
    GRANT USAGE ON SCHEMA @extschema@ TO idem_client, idem_admin;
    IF NOT pg_catalog.pg_has_role('idem_admin'::pg_catalog.name, 'idem_client'::pg_catalog.name,
                                  'MEMBER'::pg_catalog.text) THEN
        GRANT idem_client TO idem_admin;
    END IF;

    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS signature, p.proname,
               p.prorettype OPERATOR(pg_catalog.=) trigger_type AS is_trigger
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) proc_class
           AND d.refclassid OPERATOR(pg_catalog.=) ext_class
           AND d.refobjid OPERATOR(pg_catalog.=) ext_oid
           AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char"
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC'::pg_catalog.text,
                                  fn.signature);
        IF fn.proname OPERATOR(pg_catalog.=) ANY (direct_functions) THEN
            -- An upgrade from 0.3.0 or before finds them SECURITY DEFINER.
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY INVOKER RESET ALL'::pg_catalog.text,
                                      fn.signature);
        ELSIF NOT fn.is_trigger AND NOT fn.proname OPERATOR(pg_catalog.=) ANY (pure_functions) THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp'::pg_catalog.text,
                                      fn.signature);
        END IF;
        IF fn.proname OPERATOR(pg_catalog.=) ANY (client_functions) THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idem_client'::pg_catalog.text,
                                      fn.signature);
        ELSIF fn.is_trigger THEN
            -- EXECUTE is what CREATE TRIGGER checks (firing checks nothing),
            -- so only the version guard, meant for the caller's own tables,
            -- is granted.  The others assume pg_idem's tables: on a table of
            -- the caller's making they would misread its columns.
            IF fn.proname OPERATOR(pg_catalog.=) 'idem_version_guard'::pg_catalog.name THEN
                EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idem_client'::pg_catalog.text,
                                          fn.signature);
            END IF;
        ELSE
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO idem_admin'::pg_catalog.text,
                                      fn.signature);
        END IF;
    END LOOP;

    -- Tables, sequences and views: nothing for PUBLIC; admins may read.
    FOR rel IN
        SELECT c.oid::pg_catalog.regclass::pg_catalog.text AS name,
               c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'v', 'p']::pg_catalog."char"[]) AS readable
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) class_class
           AND d.refclassid OPERATOR(pg_catalog.=) ext_class
           AND d.refobjid OPERATOR(pg_catalog.=) ext_oid
           AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char"
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM PUBLIC'::pg_catalog.text, rel.name);
        IF rel.readable THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON %s TO idem_admin'::pg_catalog.text, rel.name);
        END IF;
    END LOOP;
END
$privileges$;
