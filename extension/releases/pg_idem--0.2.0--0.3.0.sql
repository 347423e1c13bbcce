-- pg_idem 0.2.0--0.3.0: frozen as released; never edit (new changes go into the next version's pieces)
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

-- extension/upgrades/0.2.0--0.3.0/00_header.sql
-- 0.2.0 -> 0.3.0, one file per concern (assembled in name order).  Every
-- name is schema-qualified (@extschema@, pg_catalog) and every operator in
-- an expression run by the script is OPERATOR(pg_catalog.op): the script
-- runs as a superuser in a schema other roles may create objects in.

-- extension/upgrades/0.2.0--0.3.0/10_keys.sql
-- Keys: role scopes (scope.c), the expired state of the two horizons
-- (lifetime.c), and the follower's server-side wait (max_wait).

-- Keys written by 0.2.0 had no owner: they get the empty scope, shared by
-- every role until they expire, as they were before.  (The functions
-- always give a scope; the default is for rows written by hand.)
ALTER TABLE @extschema@.idem_keys ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE @extschema@.idem_keys DROP CONSTRAINT idem_keys_pkey,
    ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key, scope);
ALTER TABLE @extschema@.idem_keys DROP CONSTRAINT idem_keys_state,
    ADD CONSTRAINT idem_keys_state
        CHECK (state IN ('pending', 'completed', 'failed', 'expired'));
COMMENT ON COLUMN @extschema@.idem_keys.scope IS
    'the role whose key this is (role isolation); empty for keys written before 0.3.0, shared by every role';
COMMENT ON COLUMN @extschema@.idem_keys.state IS
    'pending (claimed), completed (response kept), failed (cooldown), expired (past idem.ttl: response dropped, fingerprint kept)';

-- A fourth argument, max_wait: a new signature.  Calls with three
-- arguments (0.2 clients) resolve to the new function.
DROP FUNCTION @extschema@.idem_claim(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_claim(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_claim(bytea, bytea, interval, interval) IS
    'claim a key for one execution, or learn what a follower should do (waiting up to max_wait for the winner)';

DROP FUNCTION @extschema@.idem_begin(pg_catalog.bytea, pg_catalog.bytea, pg_catalog.interval);
CREATE FUNCTION @extschema@.idem_begin(cache_key bytea, request_hash bytea,
                                       lease interval DEFAULT NULL,
                                       max_wait interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_begin(bytea, bytea, interval, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

COMMENT ON FUNCTION @extschema@.idem_cleanup(integer) IS
    'drop responses past idem.ttl and delete finished keys past idem.tombstone_ttl, at most batch keys';

-- extension/upgrades/0.2.0--0.3.0/40_outbox.sql
-- The outbox (0.3.0): scopes, the queue / archive split, batch staging,
-- idem_outbox_stage_bytes, the backlog.  See extension/sql/40_outbox.sql.

-- The hot table keeps its constraints' and indexes' names; the 0.2.0 name
-- becomes a view of the queue and the archive.
ALTER TABLE @extschema@.idem_outbox RENAME TO idem_outbox_queue;
ALTER TABLE @extschema@.idem_outbox_queue ADD COLUMN scope text NOT NULL DEFAULT '';
-- The functions enforce what the CHECKs said, at a fraction of their cost
-- (see extension/sql/40_outbox.sql).
ALTER TABLE @extschema@.idem_outbox_queue
    DROP CONSTRAINT idem_outbox_state,
    DROP CONSTRAINT idem_outbox_one_payload,
    DROP CONSTRAINT idem_outbox_key_hashed,
    DROP CONSTRAINT idem_outbox_topic_length,
    DROP CONSTRAINT idem_outbox_attempts,
    DROP CONSTRAINT idem_outbox_published_at,
    DROP CONSTRAINT idem_outbox_dead_at;
COMMENT ON TABLE @extschema@.idem_outbox_queue IS
    'pg_idem: outbox events not yet published (and dead ones); written only through the idem_outbox_* functions';
COMMENT ON COLUMN @extschema@.idem_outbox_queue.scope IS
    'the stager''s scope (role); '''' for events staged before 0.3.0, which every scope''s drainers may claim';

DROP INDEX @extschema@.idem_outbox_claimable;
CREATE INDEX idem_outbox_claimable ON @extschema@.idem_outbox_queue (scope, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending';

CREATE TABLE @extschema@.idem_outbox_archive (
    id            bigint      NOT NULL,
    topic         text        NOT NULL,
    message_key   text,
    key_hash      bytea,
    payload       jsonb,
    payload_bytes bytea,
    headers       jsonb,
    attempts      integer     NOT NULL,
    last_error    text,
    available_at  timestamptz NOT NULL,
    claim_token   uuid,
    created_at    timestamptz NOT NULL,
    published_at  timestamptz NOT NULL,
    scope         text        NOT NULL,
    CONSTRAINT idem_outbox_archive_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE @extschema@.idem_outbox_archive IS
    'pg_idem: published outbox events, kept for idem.outbox_retention (insert-only)';
CREATE INDEX idem_outbox_archive_published_at ON @extschema@.idem_outbox_archive
    USING brin (published_at);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox_archive', '');

-- 0.2.0's published events move to the archive.
INSERT INTO @extschema@.idem_outbox_archive
    (id, topic, message_key, key_hash, payload, payload_bytes, headers,
     attempts, last_error, available_at, claim_token, created_at, published_at, scope)
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
       attempts, last_error, available_at, claim_token, created_at, published_at, scope
  FROM @extschema@.idem_outbox_queue
 WHERE state OPERATOR(pg_catalog.=) 'published';
DELETE FROM @extschema@.idem_outbox_queue WHERE state OPERATOR(pg_catalog.=) 'published';

CREATE VIEW @extschema@.idem_outbox AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM @extschema@.idem_outbox_queue
UNION ALL
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
       'published'::text, attempts, last_error, available_at, claim_token, created_at,
       published_at, NULL::timestamptz, scope
  FROM @extschema@.idem_outbox_archive;
COMMENT ON VIEW @extschema@.idem_outbox IS
    'pg_idem: every outbox event, queued or archived (the idem_outbox table of 0.2.0)';

CREATE FUNCTION @extschema@.idem_outbox_view_write()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_outbox_view_write'
LANGUAGE C;
CREATE TRIGGER idem_outbox_write INSTEAD OF UPDATE OR DELETE ON @extschema@.idem_outbox
    FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_outbox_view_write();

-- The dead-event view read the renamed table; it reads the view, as a
-- fresh install's does (the archive's constant state keeps the archive out).
CREATE OR REPLACE VIEW @extschema@.idem_outbox_dead AS
SELECT id, topic, message_key, attempts, last_error, created_at, dead_at
  FROM @extschema@.idem_outbox
 WHERE state OPERATOR(pg_catalog.=) 'dead';

CREATE FUNCTION @extschema@.idem_outbox_stage_bytes(topic text, payload bytea, key text DEFAULT NULL,
                                                    headers jsonb DEFAULT NULL,
                                                    delay interval DEFAULT '0')
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_bytes'
LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.idem_outbox_stage_batch(topic text, payloads jsonb[], keys text[] DEFAULT NULL,
                                                    headers jsonb[] DEFAULT NULL,
                                                    delay interval DEFAULT '0')
RETURNS SETOF bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_batch'
LANGUAGE C VOLATILE ROWS 100;

CREATE FUNCTION @extschema@.idem_outbox_backlog(OUT topic text, OUT state text, OUT events bigint,
                                                OUT oldest_created_at timestamptz,
                                                OUT next_available_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_outbox_backlog'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_stage(text, bytea, text, jsonb, interval) IS
    'deprecated: use idem_outbox_stage_bytes (an untyped or driver-typed payload may pick either overload)';
COMMENT ON FUNCTION @extschema@.idem_outbox_stage_bytes(text, bytea, text, jsonb, interval) IS
    'stage an event with a binary payload in the caller''s transaction; returns its id';
COMMENT ON FUNCTION @extschema@.idem_outbox_stage_batch(text, jsonb[], text[], jsonb[], interval) IS
    'stage one event per payload in one INSERT, in array order; returns their ids in that order';
COMMENT ON FUNCTION @extschema@.idem_outbox_claim(integer, interval) IS
    'lease at most batch claimable events of the caller''s scope to a fresh claim token (run in its own transaction)';
COMMENT ON FUNCTION @extschema@.idem_outbox_ack(uuid, bigint[]) IS
    'publish the events among ids that the claim still holds (archived, or deleted); returns how many';
COMMENT ON FUNCTION @extschema@.idem_outbox_wait(interval) IS
    'true as soon as an event of the caller''s scope is claimable, false after timeout (woken by the stage''s commit)';
COMMENT ON FUNCTION @extschema@.idem_outbox_backlog() IS
    'the caller''s unpublished events by topic and state (ready, leased, delayed, dead), no payloads';

-- Privileges as extension/sql/90_privileges.sql gives them.
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_view_write() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_stage_bytes(text, bytea, text, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_stage_batch(text, jsonb[], text[], jsonb[], interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_backlog() FROM PUBLIC;
ALTER FUNCTION @extschema@.idem_outbox_stage_bytes(text, bytea, text, jsonb, interval)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.idem_outbox_stage_batch(text, jsonb[], text[], jsonb[], interval)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.idem_outbox_backlog()
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
GRANT EXECUTE ON FUNCTION @extschema@.idem_outbox_stage_bytes(text, bytea, text, jsonb, interval) TO idem_client;
GRANT EXECUTE ON FUNCTION @extschema@.idem_outbox_stage_batch(text, jsonb[], text[], jsonb[], interval) TO idem_client;
GRANT EXECUTE ON FUNCTION @extschema@.idem_outbox_backlog() TO idem_client;
REVOKE ALL ON @extschema@.idem_outbox_archive FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_outbox FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_outbox_archive TO idem_admin;
GRANT SELECT ON @extschema@.idem_outbox TO idem_admin;

-- extension/upgrades/0.2.0--0.3.0/50_inbox.sql
-- Inbox: role scopes, as for keys (messages from 0.2.0 stay shared).
ALTER TABLE @extschema@.idem_inbox ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE @extschema@.idem_inbox DROP CONSTRAINT idem_inbox_pkey,
    ADD CONSTRAINT idem_inbox_pkey PRIMARY KEY (inbox_key, scope);
COMMENT ON COLUMN @extschema@.idem_inbox.scope IS
    'the role whose message this is (role isolation); empty for messages delivered before 0.3.0, shared by every role';

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
        IF NOT fn.is_trigger AND NOT fn.proname OPERATOR(pg_catalog.=) ANY (pure_functions) THEN
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
