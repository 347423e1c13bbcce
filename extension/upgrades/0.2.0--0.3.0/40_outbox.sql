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
