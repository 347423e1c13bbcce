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
--
-- The roles are cluster-wide: they are created once and kept by DROP
-- EXTENSION (another database may use them).

DO $privileges$
DECLARE
    -- The request path: what an application role needs.
    client_functions CONSTANT text[] := ARRAY[
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
        'idem_attempt_safe_name', 'idem_attempt_current', 'idem_intent_hash'];
    -- Pure functions of their arguments: no table, no need for definer rights.
    pure_functions CONSTANT text[] := ARRAY[
        'idem_key', 'idem_request_hash', 'idem_attempt_object_key',
        'idem_attempt_safe_name', 'idem_intent_hash'];
    ext_oid oid := (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'pg_idem');
    fn record;
    rel record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idem_client') THEN
        CREATE ROLE idem_client NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idem_admin') THEN
        CREATE ROLE idem_admin NOLOGIN;
    END IF;
    GRANT USAGE ON SCHEMA @extschema@ TO idem_client, idem_admin;
    IF NOT pg_catalog.pg_has_role('idem_admin', 'idem_client', 'MEMBER') THEN
        GRANT idem_client TO idem_admin;
    END IF;

    FOR fn IN
        SELECT p.oid::regprocedure AS signature, p.proname,
               p.prorettype = 'pg_catalog.trigger'::regtype AS is_trigger
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_proc p ON p.oid = d.objid
         WHERE d.classid = 'pg_catalog.pg_proc'::regclass
           AND d.refclassid = 'pg_catalog.pg_extension'::regclass
           AND d.refobjid = ext_oid AND d.deptype = 'e'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn.signature);
        IF NOT fn.is_trigger AND NOT fn.proname = ANY (pure_functions) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp',
                           fn.signature);
        END IF;
        IF fn.proname = ANY (client_functions) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO idem_client', fn.signature);
        ELSIF fn.is_trigger THEN
            -- EXECUTE is what CREATE TRIGGER checks (firing checks nothing),
            -- so only the version guard, meant for the caller's own tables,
            -- is granted.  The others assume pg_idem's tables: on a table of
            -- the caller's making they would misread its columns.
            IF fn.proname = 'idem_version_guard' THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO idem_client', fn.signature);
            END IF;
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO idem_admin', fn.signature);
        END IF;
    END LOOP;

    -- Tables, sequences and views: nothing for PUBLIC; admins may read.
    FOR rel IN
        SELECT c.oid::regclass AS name, c.relkind
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_class c ON c.oid = d.objid
         WHERE d.classid = 'pg_catalog.pg_class'::regclass
           AND d.refclassid = 'pg_catalog.pg_extension'::regclass
           AND d.refobjid = ext_oid AND d.deptype = 'e'
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM PUBLIC', rel.name);
        IF rel.relkind IN ('r', 'v', 'p') THEN
            EXECUTE format('GRANT SELECT ON %s TO idem_admin', rel.name);
        END IF;
    END LOOP;
END
$privileges$;
