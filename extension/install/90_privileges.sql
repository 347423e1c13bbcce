-- Least privilege.  Runs last, over every function the extension created:
--
--  * PUBLIC gets nothing: no function, table or view of pg_idem is usable
--    until a role is granted idem_client or idem_admin.
--  * idem_client may call the request-path functions only.  It cannot read
--    or write the state tables: cached responses can hold personal data,
--    and a row edited by hand defeats every fence.
--  * idem_admin (a member of idem_client) may also read the operator views
--    and the state tables, evict keys, reset statistics and run cleanups,
--    and delete old rows of the redrive audit (idem_redrive_log).
--  * Every function is SECURITY INVOKER, so that the role whose code calls
--    pg_idem is the scope it acts in (core/scope.c): a SECURITY DEFINER
--    function of pg_idem's would hide its caller.  The functions switch
--    to the tables' owner in C around their table access instead: the hot
--    paths (the claims, staging outbox events) run no
--    SQL text at all (direct_table.c reads and writes idem_keys and
--    idem_outbox_queue directly); the others run their fixed statements
--    through core/statements.c, as the owner and with search_path pinned
--    to pg_catalog, pg_temp, so no caller-created operator or function can
--    be resolved inside them.  None builds SQL from its arguments.  (Up to
--    0.4.0 the latter were SECURITY DEFINER; the upgrade resets them.)

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
        'idem_key', 'idem_request_hash', 'idem_edition',
        'idem_claim', 'idem_begin', 'idem_lookup', 'idem_renew',
        'idem_finalize', 'idem_release', 'idem_fail',
        'idem_outbox_stage', 'idem_outbox_claim', 'idem_outbox_ack',
        'idem_outbox_nack', 'idem_outbox_wait',
        'idem_outbox_stage_bytes', 'idem_outbox_stage_batch', 'idem_outbox_backlog',
        'idem_outbox_stage_bytes', 'idem_outbox_stage_batch', 'idem_outbox_backlog',
        'idem_inbox_begin', 'idem_inbox_done', 'idem_inbox_fail',
        'idem_outbox_redrive', 'idem_inbox_redrive',
        'idem_attempt_open', 'idem_attempt_object_key', 'idem_attempt_store',
        'idem_attempt_promote', 'idem_attempt_fail', 'idem_attempt_reopen',
        'idem_attempt_safe_name', 'idem_attempt_current', 'idem_intent_hash']::pg_catalog.name[];
    -- The extension's objects; without an extension (the SQL edition's
    -- plain script) the idem_* objects of the schema it installed into
    -- that the installing role owns (made by it, not planted by another).
    target CONSTANT pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    ext_oid pg_catalog.oid := (SELECT e.oid FROM pg_catalog.pg_extension e
                                WHERE e.extname OPERATOR(pg_catalog.=) 'pg_idem'::pg_catalog.name
                                  AND e.extnamespace OPERATOR(pg_catalog.=) target);
    installer CONSTANT pg_catalog.oid := (SELECT r.oid FROM pg_catalog.pg_roles r
                                           WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER);
    c_language CONSTANT pg_catalog.oid := (SELECT l.oid FROM pg_catalog.pg_language l
                                            WHERE l.lanname OPERATOR(pg_catalog.=) 'c'::pg_catalog.name);
    proc_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid;
    class_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid;
    ext_class CONSTANT pg_catalog.oid := 'pg_catalog.pg_extension'::pg_catalog.regclass::pg_catalog.oid;
    trigger_type CONSTANT pg_catalog.oid := 'pg_catalog.trigger'::pg_catalog.regtype::pg_catalog.oid;
    fn record;
    rel record;
    typ record;
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
               p.prorettype OPERATOR(pg_catalog.=) trigger_type AS is_trigger,
               p.prolang OPERATOR(pg_catalog.=) c_language AS is_c
          FROM pg_catalog.pg_proc p
         WHERE CASE WHEN ext_oid IS NOT NULL
                    THEN EXISTS (SELECT FROM pg_catalog.pg_depend d
                                  WHERE d.classid OPERATOR(pg_catalog.=) proc_class
                                    AND d.objid OPERATOR(pg_catalog.=) p.oid
                                    AND d.refclassid OPERATOR(pg_catalog.=) ext_class
                                    AND d.refobjid OPERATOR(pg_catalog.=) ext_oid
                                    AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char")
                    ELSE p.pronamespace OPERATOR(pg_catalog.=) target
                         AND p.proowner OPERATOR(pg_catalog.=) installer
                         AND p.proname OPERATOR(pg_catalog.~~) 'idem\_%'::pg_catalog.text END
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC'::pg_catalog.text,
                                  fn.signature);
        IF NOT fn.is_trigger AND fn.is_c THEN
            -- An upgrade from 0.4.0 or before finds most SECURITY DEFINER.
            -- (The SQL edition's functions keep what they were created with.)
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY INVOKER RESET ALL'::pg_catalog.text,
                                      fn.signature);
        END IF;
        -- The SQL edition's internal functions (idem__*): what its
        -- request-path functions call, as their caller (each checks whose
        -- call it is itself).
        IF fn.proname OPERATOR(pg_catalog.=) ANY (client_functions)
           OR fn.proname OPERATOR(pg_catalog.~~) 'idem\_\_%'::pg_catalog.text THEN
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

    -- The SQL edition's internal types (idem__*): USAGE for nobody but the
    -- owner, so that no other role can keep a value of them in a table, a
    -- view, a function or a type of its own (see the domain idem__caller).
    FOR typ IN
        SELECT t.oid::pg_catalog.regtype::pg_catalog.text AS name
          FROM pg_catalog.pg_type t
         WHERE t.typnamespace OPERATOR(pg_catalog.=) target
           AND t.typname OPERATOR(pg_catalog.~~) 'idem\_\_%'::pg_catalog.text
           AND t.typtype OPERATOR(pg_catalog.=) ANY (ARRAY['c', 'd']::pg_catalog."char"[])
           AND t.typowner OPERATOR(pg_catalog.=) installer
    LOOP
        EXECUTE pg_catalog.format('REVOKE USAGE ON TYPE %s FROM PUBLIC'::pg_catalog.text, typ.name);
    END LOOP;

    -- Tables, sequences and views: nothing for PUBLIC; admins may read.
    FOR rel IN
        SELECT c.oid::pg_catalog.regclass::pg_catalog.text AS name,
               c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'v', 'p']::pg_catalog."char"[]) AS readable
          FROM pg_catalog.pg_class c
         WHERE CASE WHEN ext_oid IS NOT NULL
                    THEN EXISTS (SELECT FROM pg_catalog.pg_depend d
                                  WHERE d.classid OPERATOR(pg_catalog.=) class_class
                                    AND d.objid OPERATOR(pg_catalog.=) c.oid
                                    AND d.refclassid OPERATOR(pg_catalog.=) ext_class
                                    AND d.refobjid OPERATOR(pg_catalog.=) ext_oid
                                    AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char")
                    ELSE c.relnamespace OPERATOR(pg_catalog.=) target
                         AND c.relowner OPERATOR(pg_catalog.=) installer
                         AND c.relname OPERATOR(pg_catalog.~~) 'idem\_%'::pg_catalog.text
                         AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'v', 'p', 'S']::pg_catalog."char"[]) END
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM PUBLIC'::pg_catalog.text, rel.name);
        IF rel.readable THEN
            EXECUTE pg_catalog.format('GRANT SELECT ON %s TO idem_admin'::pg_catalog.text, rel.name);
        END IF;
    END LOOP;
END
$privileges$;

-- The redrive audit grows by a row per redrive and nothing prunes it: its
-- retention is the operators' decision (docs/guides/inbox-outbox.md).
GRANT DELETE ON @extschema@.idem_redrive_log TO idem_admin;
