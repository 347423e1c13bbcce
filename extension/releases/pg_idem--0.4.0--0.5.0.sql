-- generated from extension/install/00_schema_check.sql extension/install/05_preload_check.sql extension/upgrades/0.4.0--0.5.0/00_header.sql extension/upgrades/0.4.0--0.5.0/10_scope_oids.sql extension/upgrades/0.4.0--0.5.0/20_attempt_scopes.sql extension/upgrades/0.4.0--0.5.0/85_not_null_constraint_names.sql extension/install/90_privileges.sql: edit those files
\echo Use "CREATE EXTENSION pg_idem" or "ALTER EXTENSION pg_idem UPDATE" to load this file. \quit

-- extension/install/00_schema_check.sql
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

-- extension/install/05_preload_check.sql
-- Say at CREATE EXTENSION (and ALTER EXTENSION UPDATE) what pg_idem
-- without shared_preload_libraries costs: no cleanup worker, no counters,
-- polling waits (core/preload.c).  Only the library knows whether it was
-- preloaded, so a C function asks it; it is dropped again at once and the
-- extension keeps no trace of it.
CREATE FUNCTION idem_preload_notice() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idem_preload_notice'
LANGUAGE C VOLATILE;
SELECT idem_preload_notice();
DROP FUNCTION idem_preload_notice();

-- extension/upgrades/0.4.0--0.5.0/00_header.sql
-- 0.4.0 -> 0.5.0, one file per concern (assembled in name order).  Every
-- name is schema-qualified (@extschema@, pg_catalog) and every operator in
-- an expression run by the script is OPERATOR(pg_catalog.op): the script
-- runs as a superuser in a schema other roles may create objects in.

-- extension/upgrades/0.4.0--0.5.0/10_scope_oids.sql
-- The scope becomes the role's identity (its OID) instead of its name:
-- a renamed role keeps its rows, a new role created under an old name
-- gets none of them.  Existing rows become:
--
--  * ''            -> 0: the shared scope of rows from before 0.3.0, as
--                     before usable by every role until they expire;
--  * a role's name -> that role's OID;
--  * a name no role has any more -> 1, an OID no role has or can get
--                     (template1's; manually assigned OIDs are unique
--                     across the catalogs, CREATE ROLE assigns from 16384
--                     up): no role reaches those rows again (a role that
--                     took the name since would have, which is the hole
--                     this closes); they expire with the usual horizons,
--                     and idem_admin sees them.
--
-- idem_outbox and idem_outbox_dead read the column, so they are dropped
-- and re-created around the change, keeping the privileges granted on
-- them (the monitoring role's, say); the other operator views gain a
-- scope column (CREATE OR REPLACE keeps theirs).

CREATE FUNCTION @extschema@.idem_upgrade_scope_oid(name pg_catalog.text)
RETURNS pg_catalog.oid
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
SELECT CASE WHEN name OPERATOR(pg_catalog.=) ''::pg_catalog.text THEN 0::pg_catalog.oid
            ELSE COALESCE((SELECT r.oid FROM pg_catalog.pg_authid r
                            WHERE r.rolname OPERATOR(pg_catalog.=) name::pg_catalog.name),
                          1::pg_catalog.oid) END
$$;

DO $scope_oids$
DECLARE
    grants pg_catalog.text[];
    g pg_catalog.text;
BEGIN
    -- What was granted on the two views, table- and column-level.
    SELECT pg_catalog.array_agg(pg_catalog.format('GRANT %s%s ON @extschema@.%I TO %s%s'::pg_catalog.text,
               x.privilege_type, x.columns, x.relname,
               CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'::pg_catalog.text
                    ELSE pg_catalog.quote_ident(x.grantee::pg_catalog.regrole::pg_catalog.text) END,
               CASE WHEN x.is_grantable THEN ' WITH GRANT OPTION'::pg_catalog.text ELSE ''::pg_catalog.text END))
      INTO grants
      FROM (SELECT c.relname, a.grantee, a.privilege_type, a.is_grantable, ''::pg_catalog.text AS columns
              FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
             WHERE c.relnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
               AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['idem_outbox', 'idem_outbox_dead']::pg_catalog.name[])
               AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
            UNION ALL
            SELECT c.relname, a.grantee, a.privilege_type, a.is_grantable,
                   pg_catalog.format(' (%I)'::pg_catalog.text, t.attname)
              FROM pg_catalog.pg_class c
              JOIN pg_catalog.pg_attribute t ON t.attrelid OPERATOR(pg_catalog.=) c.oid,
                   pg_catalog.aclexplode(t.attacl) a
             WHERE c.relnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
               AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['idem_outbox', 'idem_outbox_dead']::pg_catalog.name[])
               AND a.grantee OPERATOR(pg_catalog.<>) c.relowner) x;

    DROP VIEW @extschema@.idem_outbox_dead;
    DROP VIEW @extschema@.idem_outbox;

    ALTER TABLE @extschema@.idem_keys ALTER COLUMN scope DROP DEFAULT,
        ALTER COLUMN scope TYPE pg_catalog.regrole USING @extschema@.idem_upgrade_scope_oid(scope)::pg_catalog.regrole,
        ALTER COLUMN scope SET DEFAULT 0;
    ALTER TABLE @extschema@.idem_inbox ALTER COLUMN scope DROP DEFAULT,
        ALTER COLUMN scope TYPE pg_catalog.regrole USING @extschema@.idem_upgrade_scope_oid(scope)::pg_catalog.regrole,
        ALTER COLUMN scope SET DEFAULT 0;
    ALTER TABLE @extschema@.idem_outbox_queue ALTER COLUMN scope DROP DEFAULT,
        ALTER COLUMN scope TYPE pg_catalog.regrole USING @extschema@.idem_upgrade_scope_oid(scope)::pg_catalog.regrole,
        ALTER COLUMN scope SET DEFAULT 0;
    ALTER TABLE @extschema@.idem_outbox_archive
        ALTER COLUMN scope TYPE pg_catalog.regrole USING @extschema@.idem_upgrade_scope_oid(scope)::pg_catalog.regrole;

    CREATE VIEW @extschema@.idem_outbox AS
    SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
           attempts, last_error, available_at, claim_token, created_at, published_at,
           dead_at, scope
      FROM @extschema@.idem_outbox_queue
    UNION ALL
    SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
           'published'::pg_catalog.text, attempts, last_error, available_at, claim_token, created_at,
           published_at, NULL::pg_catalog.timestamptz, scope
      FROM @extschema@.idem_outbox_archive;
    COMMENT ON VIEW @extschema@.idem_outbox IS
        'pg_idem: every outbox event, queued or archived (the idem_outbox table of 0.2.0)';
    CREATE TRIGGER idem_outbox_write INSTEAD OF UPDATE OR DELETE ON @extschema@.idem_outbox
        FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_outbox_view_write();

    CREATE VIEW @extschema@.idem_outbox_dead AS
    SELECT id, topic, message_key, attempts, last_error, created_at, dead_at,
           scope::pg_catalog.regrole AS scope
      FROM @extschema@.idem_outbox
     WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
    COMMENT ON VIEW @extschema@.idem_outbox_dead IS
        'outbox events that used up their attempts (payloads stay in idem_outbox)';

    FOREACH g IN ARRAY COALESCE(grants, ARRAY[]::pg_catalog.text[]) LOOP
        EXECUTE g;
    END LOOP;
END
$scope_oids$;

DROP FUNCTION @extschema@.idem_upgrade_scope_oid(pg_catalog.text);

COMMENT ON COLUMN @extschema@.idem_keys.scope IS
    'the role whose key this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for keys written before 0.3.0, shared by every role';
COMMENT ON COLUMN @extschema@.idem_outbox_queue.scope IS
    'the OID of the stager''s scope (role); 0 for events staged before 0.3.0, which every scope''s drainers may claim';
COMMENT ON COLUMN @extschema@.idem_inbox.scope IS
    'the role whose message this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for messages delivered before 0.3.0, shared by every role';

CREATE OR REPLACE VIEW @extschema@.idem_inflight AS
SELECT cache_key, generation, in_transaction, created_at, lease_expires_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS lease_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp();

CREATE OR REPLACE VIEW @extschema@.idem_stuck AS
SELECT cache_key, generation, created_at, lease_expires_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) lease_expires_at AS expired_for,
       scope::pg_catalog.regrole AS scope,
       pg_catalog.count(*) OVER (PARTITION BY scope) AS stuck_in_scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp();
COMMENT ON VIEW @extschema@.idem_stuck IS
    'pending keys past their lease: the owner died or stalled; the next same request recovers them (stuck_in_scope: how many the row''s scope has)';

CREATE OR REPLACE VIEW @extschema@.idem_cooling AS
SELECT cache_key, generation, finished_at, lease_expires_at AS cooldown_ends_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS cooldown_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();

CREATE OR REPLACE VIEW @extschema@.idem_inbox_dead AS
SELECT consumer, message_id, error_count, max_attempts, last_error,
       received_at, failed_at, dead_at, scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_inbox
 WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;

-- extension/upgrades/0.4.0--0.5.0/20_attempt_scopes.sql
-- Attempts get a scope like keys, messages and events: role B neither
-- resumes, fails nor squats on role A's attempt, and never learns whether
-- it exists.  The request's unique key and a replace-kind target's
-- current pointer are per scope.  Attempts and pointers from before 0.5.0
-- had none: they get the shared scope (0), usable by every role as they
-- were (created_by still separates principals) until they are pruned.

ALTER TABLE @extschema@.idem_attempts
    ADD COLUMN scope pg_catalog.regrole NOT NULL DEFAULT 0,
    DROP CONSTRAINT idem_attempts_request_unique,
    ADD CONSTRAINT idem_attempts_request_unique UNIQUE (kind, target, client_request_id, scope);
COMMENT ON COLUMN @extschema@.idem_attempts.scope IS
    'the role whose attempt this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for attempts opened before 0.5.0, shared by every role';
COMMENT ON COLUMN @extschema@.idem_attempts.created_by IS
    'the caller''s principal, as it says: separates principals inside one role''s scope (forbidden), no boundary between roles';

ALTER TABLE @extschema@.idem_attempt_targets
    ADD COLUMN scope pg_catalog.regrole NOT NULL DEFAULT 0,
    DROP CONSTRAINT idem_attempt_targets_pkey,
    ADD CONSTRAINT idem_attempt_targets_pkey PRIMARY KEY (kind, target, scope);
COMMENT ON TABLE @extschema@.idem_attempt_targets IS
    'pg_idem: current promoted attempt of each replace-kind target, per scope';

-- extension/upgrades/0.4.0--0.5.0/85_not_null_constraint_names.sql
-- PostgreSQL 18 records NOT NULL constraints in pg_constraint, named after
-- the table when the column got them.  idem_outbox_queue was idem_outbox
-- before 0.3.0, so an installation created before 0.3.0 on PostgreSQL 18
-- has idem_outbox_<column>_not_null where a fresh install has
-- idem_outbox_queue_<column>_not_null.  Rename them, so that the upgraded
-- catalog equals a fresh install's (tests/t/050_upgrade.pl).  Before 18
-- there are no such rows and this does nothing.
DO $not_null_names$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT con.conname,
               pg_catalog.concat('idem_outbox_queue_', att.attname, '_not_null') AS wanted
          FROM pg_catalog.pg_constraint con
          JOIN pg_catalog.pg_attribute att
            ON att.attrelid OPERATOR(pg_catalog.=) con.conrelid
           AND att.attnum OPERATOR(pg_catalog.=) con.conkey[1]
         WHERE con.conrelid OPERATOR(pg_catalog.=) '@extschema@.idem_outbox_queue'::pg_catalog.regclass
           AND con.contype OPERATOR(pg_catalog.=) 'n'
           AND con.conname OPERATOR(pg_catalog.=) pg_catalog.concat('idem_outbox_', att.attname, '_not_null')
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.idem_outbox_queue RENAME CONSTRAINT %I TO %I',
                                  c.conname, c.wanted);
    END LOOP;
END
$not_null_names$;

-- extension/install/90_privileges.sql
-- Least privilege.  Runs last, over every function the extension created:
--
--  * PUBLIC gets nothing: no function, table or view of pg_idem is usable
--    until a role is granted idem_client or idem_admin.
--  * idem_client may call the request-path functions only.  It cannot read
--    or write the state tables: cached responses can hold personal data,
--    and a row edited by hand defeats every fence.
--  * idem_admin (a member of idem_client) may also read the operator views
--    and the state tables, evict keys, reset statistics and run cleanups.
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
        IF NOT fn.is_trigger THEN
            -- An upgrade from 0.4.0 or before finds most SECURITY DEFINER.
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY INVOKER RESET ALL'::pg_catalog.text,
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
