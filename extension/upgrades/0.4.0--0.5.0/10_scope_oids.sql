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
