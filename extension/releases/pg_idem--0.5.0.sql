-- generated from extension/install/00_schema_check.sql extension/install/05_preload_check.sql extension/install/10_keys.sql extension/install/20_claims.sql extension/install/30_in_transaction.sql extension/install/40_outbox.sql extension/install/50_inbox.sql extension/install/60_attempts.sql extension/install/70_version_guard.sql extension/install/80_operations.sql extension/install/90_privileges.sql: edit those files
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

-- extension/install/10_keys.sql
-- State of every idempotency key: one row per key and scope (the role it
-- belongs to), keyed by a SHA-256 digest so that no caller-controlled
-- string ever reaches the index.
--
-- Only the primary key is indexed: renew and finalize change no indexed
-- column, so with the fillfactor headroom they are HOT updates.
CREATE TABLE idem_keys (
    cache_key        bytea       NOT NULL,
    state            text        NOT NULL,
    request_hash     bytea,
    claim_id         uuid,
    generation       bigint      NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at      timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    replayable       boolean     NOT NULL DEFAULT true,
    in_transaction   boolean     NOT NULL DEFAULT false,
    scope            regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key, scope),
    CONSTRAINT idem_keys_state CHECK (state IN ('pending', 'completed', 'failed', 'expired')),
    CONSTRAINT idem_keys_cache_key_length CHECK (octet_length(cache_key) = 32),
    CONSTRAINT idem_keys_request_hash_length
        CHECK (request_hash IS NULL OR octet_length(request_hash) = 32),
    CONSTRAINT idem_keys_completed_has_response
        CHECK (state <> 'completed' OR NOT replayable
               OR (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT idem_keys_pending_has_claim
        CHECK (state <> 'pending'
               OR (request_hash IS NOT NULL AND claim_id IS NOT NULL
                   AND lease_expires_at IS NOT NULL)),
    CONSTRAINT idem_keys_failed_has_cooldown
        CHECK (state <> 'failed' OR lease_expires_at IS NOT NULL),
    CONSTRAINT idem_keys_status_range
        CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599)
) WITH (fillfactor = 70);

COMMENT ON TABLE idem_keys IS
    'pg_idem: one row per idempotency key; written only through the idem_* functions';
COMMENT ON COLUMN idem_keys.generation IS
    'fencing number: strictly increases with every successful claim or steal of the key';
COMMENT ON COLUMN idem_keys.scope IS
    'the role whose key this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for keys written before 0.3.0, shared by every role';
COMMENT ON COLUMN idem_keys.state IS
    'pending (claimed), completed (response kept), failed (cooldown), expired (past idem.ttl: response dropped, fingerprint kept)';
COMMENT ON COLUMN idem_keys.in_transaction IS
    'claimed by idem_begin: must be finished before its transaction commits';

-- Generations come from one sequence so that a key's generation never goes
-- back, not even after its row was released, cleaned up or evicted.
CREATE SEQUENCE idem_generation_seq AS bigint;

-- Keep the cached responses in pg_dump output: restoring a database without
-- them would re-run every request retried after the restore.
SELECT pg_catalog.pg_extension_config_dump('idem_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idem_generation_seq', '');

-- What idem_claim, idem_begin and idem_lookup answer.
CREATE TYPE idem_claim_result AS (
    outcome          text,
    claim_id         uuid,
    generation       bigint,
    lease_expires_at timestamptz,
    retry_after      interval,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea
);

-- extension/install/20_claims.sql
-- The request-path functions. All are C; none is STRICT, so that a NULL
-- argument gets a clear error instead of a silent NULL result.

CREATE FUNCTION idem_key(principal text, method text, target text, key text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_key(text, text, text, text) IS
    'cache key: SHA-256 of the length-delimited (principal, method, target, key) tuple';

CREATE FUNCTION idem_request_hash(body bytea)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_request_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_request_hash(bytea) IS
    'request hash: SHA-256 of the request body (same as sha256(body))';

CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL,
                           max_wait interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_claim(bytea, bytea, interval, interval) IS
    'claim a key for one execution, or learn what a follower should do (waiting up to max_wait for the winner)';

CREATE FUNCTION idem_lookup(cache_key bytea, request_hash bytea)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE;
COMMENT ON FUNCTION idem_lookup(bytea, bytea) IS
    'read-only view of a key, in the shape of idem_claim (a follower''s poll)';

CREATE FUNCTION idem_renew(cache_key bytea, claim_id uuid,
                           lease interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_renew'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_renew(bytea, uuid, interval) IS
    'extend an owned lease; NULL when the claim is no longer owned';

CREATE FUNCTION idem_finalize(cache_key bytea, claim_id uuid, status integer,
                              headers jsonb, body bytea,
                              strict boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_finalize'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_finalize(bytea, uuid, integer, jsonb, bytea, boolean) IS
    'store the response of an owned claim; strict raises IL001 when not owned';

CREATE FUNCTION idem_release(cache_key bytea, claim_id uuid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_release(bytea, uuid) IS
    'give an owned key up without caching anything: claimable again at once';

CREATE FUNCTION idem_fail(cache_key bytea, claim_id uuid,
                          cooldown interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_fail(bytea, uuid, interval) IS
    'mark an owned key failed; same-request claims get cooldown until it ends';

CREATE FUNCTION idem_cleanup(batch integer DEFAULT 1000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_cleanup(integer) IS
    'drop responses past idem.ttl and delete finished keys past idem.tombstone_ttl, at most batch keys';

-- extension/install/30_in_transaction.sql
-- In-transaction mode: the claim, the handler's writes and the finalize
-- commit together, in the caller's transaction.

CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL,
                           max_wait interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval, interval) IS
    'claim a key inside the caller''s transaction; it must be finished before COMMIT';

CREATE FUNCTION idem_keys_claim_finished()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_keys_claim_finished'
LANGUAGE C;

-- Queued only for rows idem_begin wrote, checked at commit.
CREATE CONSTRAINT TRIGGER idem_keys_claim_finished
    AFTER INSERT OR UPDATE ON idem_keys
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND NEW.in_transaction)
    EXECUTE FUNCTION idem_keys_claim_finished();

-- extension/install/40_outbox.sql
-- The transactional outbox: events staged in the caller's transaction and
-- published by drainers that claim them in batches under a fenced lease.
--
-- Three relations:
--  * idem_outbox_queue, the hot table: events waiting, leased, backing off
--    or dead.  Small whatever the history: an ack moves the event out.
--  * idem_outbox_archive: published events, kept for idem.outbox_retention
--    (insert-only; the ack's DELETE + INSERT never rewrites a queue row's
--    index entries, and vacuum of the queue stays cheap).  With
--    idem.outbox_archive = off an ack deletes the event outright.
--  * idem_outbox, a view of both with 0.2.0's columns (plus scope), which
--    admins read and tests may edit by hand (INSTEAD OF triggers).

-- An event's id orders it: per-key order is id order.  An explicit
-- sequence (not an identity) so that pg_dump keeps its position.
CREATE SEQUENCE idem_outbox_id_seq AS bigint;

CREATE TABLE idem_outbox_queue (
    id            bigint      NOT NULL DEFAULT nextval('idem_outbox_id_seq'),
    topic         text        NOT NULL,
    message_key   text,
    key_hash      bytea,
    payload       jsonb,
    payload_bytes bytea,
    headers       jsonb,
    state         text        NOT NULL DEFAULT 'pending',
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    available_at  timestamptz NOT NULL,
    claim_token   uuid,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz,
    dead_at       timestamptz,
    scope         regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id)
);
-- Default fillfactor (100) on purpose: with room kept on each page (40 %)
-- the claim's rewrite of an event stays on its page and logs only the
-- changed bytes (WAL per consumed event 0.75 x pgmq's instead of 1.05 x),
-- but staging by 4 clients on PostgreSQL 15 ran at 0.57 x (measured,
-- docs/benchmarks.md#the-outbox): staging is the producers' hot path,
-- inside their own transactions.
-- No CHECK constraints: PostgreSQL rebuilds them from their stored text
-- in every executor, and every stage is an executor of its own (the seven
-- of 0.2.0 cost more than half of a stage's CPU).  The functions are the
-- table's only writers and enforce what they said: topic 1 .. 255 bytes,
-- exactly one of payload / payload_bytes, key_hash = SHA-256(message_key),
-- state pending or dead with dead_at set exactly for dead, attempts
-- counted up from 0.  (Hand edits through idem_outbox are not checked.)
ALTER SEQUENCE idem_outbox_id_seq OWNED BY idem_outbox_queue.id;

COMMENT ON TABLE idem_outbox_queue IS
    'pg_idem: outbox events not yet published (and dead ones); written only through the idem_outbox_* functions';
COMMENT ON COLUMN idem_outbox_queue.available_at IS
    'when the event can next be claimed: staging delay, nack backoff, or the end of the current lease';
COMMENT ON COLUMN idem_outbox_queue.attempts IS
    'publish attempts so far, counted when a drainer claims the event';
COMMENT ON COLUMN idem_outbox_queue.key_hash IS
    'SHA-256 of message_key: the caller''s string itself is never indexed';
COMMENT ON COLUMN idem_outbox_queue.scope IS
    'the OID of the stager''s scope (role); 0 for events staged before 0.3.0, which every scope''s drainers may claim';

-- What a claim scans: one scope's pending events in the order they become
-- claimable.
CREATE INDEX idem_outbox_claimable ON idem_outbox_queue (scope, available_at, id)
    WHERE state = 'pending';
-- The per-key order probe: is an earlier event of this key still pending?
CREATE INDEX idem_outbox_key_order ON idem_outbox_queue (key_hash, id)
    WHERE state = 'pending' AND key_hash IS NOT NULL;

CREATE TABLE idem_outbox_archive (
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
    scope         regrole     NOT NULL,
    CONSTRAINT idem_outbox_archive_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE idem_outbox_archive IS
    'pg_idem: published outbox events, kept for idem.outbox_retention (insert-only)';
-- (No state column: every row is published, which lets a query of
-- idem_outbox for another state skip the archive.)
-- The prune's range scan: rows arrive in published_at order.
CREATE INDEX idem_outbox_archive_published_at ON idem_outbox_archive
    USING brin (published_at);

SELECT pg_catalog.pg_extension_config_dump('idem_outbox_queue', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_archive', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_id_seq', '');

CREATE VIEW idem_outbox AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM idem_outbox_queue
UNION ALL
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
       'published'::text, attempts, last_error, available_at, claim_token, created_at,
       published_at, NULL::timestamptz, scope
  FROM idem_outbox_archive;
COMMENT ON VIEW idem_outbox IS
    'pg_idem: every outbox event, queued or archived (the idem_outbox table of 0.2.0)';

-- Hand edits through the view land where the row is.  The extension never
-- writes through it; its callers need the privileges on the tables.
CREATE FUNCTION idem_outbox_view_write()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_outbox_view_write'
LANGUAGE C;

CREATE TRIGGER idem_outbox_write INSTEAD OF UPDATE OR DELETE ON idem_outbox
    FOR EACH ROW EXECUTE FUNCTION idem_outbox_view_write();

CREATE FUNCTION idem_outbox_stage(topic text, payload jsonb, key text DEFAULT NULL,
                                  headers jsonb DEFAULT NULL,
                                  delay interval DEFAULT '0')
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_json'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_stage(text, jsonb, text, jsonb, interval) IS
    'stage an event with a JSON payload in the caller''s transaction; returns its id';

CREATE FUNCTION idem_outbox_stage(topic text, payload bytea, key text DEFAULT NULL,
                                  headers jsonb DEFAULT NULL,
                                  delay interval DEFAULT '0')
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_bytes'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_stage(text, bytea, text, jsonb, interval) IS
    'deprecated: use idem_outbox_stage_bytes (an untyped or driver-typed payload may pick either overload)';

CREATE FUNCTION idem_outbox_stage_bytes(topic text, payload bytea, key text DEFAULT NULL,
                                        headers jsonb DEFAULT NULL,
                                        delay interval DEFAULT '0')
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_bytes'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_stage_bytes(text, bytea, text, jsonb, interval) IS
    'stage an event with a binary payload in the caller''s transaction; returns its id';

CREATE FUNCTION idem_outbox_stage_batch(topic text, payloads jsonb[], keys text[] DEFAULT NULL,
                                        headers jsonb[] DEFAULT NULL,
                                        delay interval DEFAULT '0')
RETURNS SETOF bigint
AS 'MODULE_PATHNAME', 'idem_outbox_stage_batch'
LANGUAGE C VOLATILE ROWS 100;
COMMENT ON FUNCTION idem_outbox_stage_batch(text, jsonb[], text[], jsonb[], interval) IS
    'stage one event per payload in one call, in array order; returns their ids in that order';

CREATE FUNCTION idem_outbox_claim(batch integer, lease interval DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, payload_bytes bytea,
               headers jsonb, attempts integer, created_at timestamptz,
               claim_token uuid, lease_expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_claim'
LANGUAGE C VOLATILE ROWS 100;
COMMENT ON FUNCTION idem_outbox_claim(integer, interval) IS
    'lease at most batch claimable events of the caller''s scope to a fresh claim token (run in its own transaction)';

CREATE FUNCTION idem_outbox_ack(token uuid, ids bigint[])
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_ack(uuid, bigint[]) IS
    'publish the events among ids that the claim still holds (archived, or deleted); returns how many';

CREATE TYPE idem_outbox_nack_result AS (
    outcome     text,
    attempts    integer,
    retry_after interval
);

CREATE FUNCTION idem_outbox_nack(token uuid, id bigint, error text)
RETURNS idem_outbox_nack_result
AS 'MODULE_PATHNAME', 'idem_outbox_nack'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_nack(uuid, bigint, text) IS
    'a failed publish: retry after the backoff, dead after the last attempt, or stale';

CREATE FUNCTION idem_outbox_prune(older_than interval, batch integer DEFAULT 1000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_prune'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_prune(interval, integer) IS
    'delete at most batch published or dead events finished more than older_than ago';

CREATE FUNCTION idem_outbox_wait(timeout interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_outbox_wait'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_wait(interval) IS
    'true as soon as an event of the caller''s scope is claimable, false after timeout (woken by the stage''s commit)';

CREATE FUNCTION idem_outbox_backlog(OUT topic text, OUT state text, OUT events bigint,
                                    OUT oldest_created_at timestamptz,
                                    OUT next_available_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_outbox_backlog'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_backlog() IS
    'the caller''s unpublished events by topic and state (ready, leased, delayed, dead), no payloads';

-- extension/install/50_inbox.sql
-- The message inbox: one row per (consumer, message_id), processed once.

CREATE TABLE idem_inbox (
    inbox_key          bytea       NOT NULL,
    consumer           text        NOT NULL,
    message_id         text        NOT NULL,
    payload_hash       bytea,
    state              text        NOT NULL,
    max_attempts       integer,
    error_count        integer     NOT NULL DEFAULT 0,
    last_error         text,
    received_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempt_started_at timestamptz,
    failed_at          timestamptz,
    retry_at           timestamptz,
    processed_at       timestamptz,
    dead_at            timestamptz,
    scope              regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_inbox_pkey PRIMARY KEY (inbox_key, scope),
    CONSTRAINT idem_inbox_state
        CHECK (state IN ('processing', 'failed', 'done', 'dead')),
    CONSTRAINT idem_inbox_key_length CHECK (octet_length(inbox_key) = 32),
    CONSTRAINT idem_inbox_payload_hash_length
        CHECK (payload_hash IS NULL OR octet_length(payload_hash) = 32),
    CONSTRAINT idem_inbox_error_count CHECK (error_count >= 0),
    CONSTRAINT idem_inbox_within_cap
        CHECK (max_attempts IS NULL OR state = 'dead' OR error_count <= max_attempts),
    CONSTRAINT idem_inbox_done_at CHECK ((state = 'done') = (processed_at IS NOT NULL)),
    CONSTRAINT idem_inbox_dead_at CHECK ((state = 'dead') = (dead_at IS NOT NULL))
) WITH (fillfactor = 70);

COMMENT ON TABLE idem_inbox IS
    'pg_idem: inbox messages; written only through the idem_inbox_* functions';
COMMENT ON COLUMN idem_inbox.inbox_key IS
    'SHA-256 of the length-delimited (consumer, message_id): the strings themselves are never indexed';
COMMENT ON COLUMN idem_inbox.state IS
    'processing exists only inside the consumer''s transaction; committed rows are failed, done or dead';
COMMENT ON COLUMN idem_inbox.error_count IS
    'failed attempts: recorded by idem_inbox_fail, or by the consumer''s backend when its session ended mid-attempt';
COMMENT ON COLUMN idem_inbox.scope IS
    'the role whose message this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for messages delivered before 0.3.0, shared by every role';
COMMENT ON COLUMN idem_inbox.payload_hash IS
    'SHA-256 of the payload; NULL on legacy rows, which dedup any payload';

SELECT pg_catalog.pg_extension_config_dump('idem_inbox', '');

CREATE FUNCTION idem_inbox_begin(consumer text, message_id text, payload_hash bytea,
                                 max_attempts integer DEFAULT 5)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_inbox_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_inbox_begin(text, text, bytea, integer) IS
    'in the consumer''s transaction: process, duplicate, dead or mismatch';

CREATE FUNCTION idem_inbox_done(consumer text, message_id text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_inbox_done'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_inbox_done(text, text) IS
    'the message begun in this transaction is processed; commits with its effects';

CREATE TYPE idem_inbox_fail_result AS (
    outcome     text,
    error_count integer,
    retry_after interval
);

CREATE FUNCTION idem_inbox_fail(consumer text, message_id text, error text)
RETURNS idem_inbox_fail_result
AS 'MODULE_PATHNAME', 'idem_inbox_fail'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_inbox_fail(text, text, text) IS
    'record a failed attempt after its rollback: retry (with a delay), dead at the cap, or duplicate';

CREATE FUNCTION idem_inbox_retry(consumer text, message_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_inbox_retry'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_inbox_retry(text, text) IS
    'revive a dead message with a fresh count of attempts; false if it is not dead';

CREATE FUNCTION idem_inbox_prune(older_than interval, batch integer DEFAULT 1000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_inbox_prune'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_inbox_prune(interval, integer) IS
    'delete at most batch done or dead messages finished more than older_than ago';

CREATE FUNCTION idem_inbox_message_done()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_inbox_message_done'
LANGUAGE C;

-- Queued only for rows idem_inbox_begin set processing, checked at commit.
CREATE CONSTRAINT TRIGGER idem_inbox_message_done
    AFTER INSERT OR UPDATE ON idem_inbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'processing')
    EXECUTE FUNCTION idem_inbox_message_done();

-- extension/install/60_attempts.sql
-- Multi-step attempts (extension/attempts/): an upload or an export that
-- writes a blob outside the database and then publishes it, driven by a
-- state machine whose every transition is a status + generation CAS.  The
-- transitions are the protocol's (extension/protocol/protocol.toml, shown
-- in docs/reference/protocol.md); the status and reason CHECKs below list
-- its states, and the protocol check keeps the two in step.
--
-- A reopen increments the generation and so rotates the object key: a late
-- put of an older generation lands on a key no attempt will ever promote.

-- What kinds of attempts exist: how a promotion lands (append: the caller
-- inserts its entity; replace: a current pointer per target flips) and
-- where the blobs go.
CREATE TABLE idem_attempt_kinds (
    kind          text        NOT NULL,
    mode          text        NOT NULL,
    key_prefix    text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CONSTRAINT idem_attempt_kinds_pkey PRIMARY KEY (kind),
    CONSTRAINT idem_attempt_kinds_mode CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['append', 'replace']::pg_catalog.text[])),
    CONSTRAINT idem_attempt_kinds_kind_format CHECK (kind OPERATOR(pg_catalog.~) '^[a-z][a-z0-9_]{0,62}$'::pg_catalog.text),
    CONSTRAINT idem_attempt_kinds_key_prefix_length CHECK (pg_catalog.octet_length(key_prefix) OPERATOR(pg_catalog.<=) 255)
);
COMMENT ON TABLE idem_attempt_kinds IS
    'pg_idem: registered attempt kinds (idem_attempt_register_kind)';

-- One row per attempt: the tombstone the replay decision table is keyed
-- on, kept for the retention after the attempt ends.  The unique key holds
-- caller-controlled strings, so their lengths are capped (63 + 512 + 255
-- bytes) far below the B-tree entry limit.
CREATE TABLE idem_attempts (
    attempt_id        uuid        NOT NULL,
    kind              text        NOT NULL,
    target            text        NOT NULL,
    client_request_id text        NOT NULL,
    created_by        text        NOT NULL,
    intent            jsonb       NOT NULL,
    intent_hash       bytea       NOT NULL,
    generation        bigint      NOT NULL DEFAULT 1,
    status            text        NOT NULL DEFAULT 'pending',
    failure_reason    text,
    declared_digest   bytea,
    object_name       text        NOT NULL,
    object_key        text        NOT NULL,
    event_id          bigint,
    superseded_by     uuid,
    swept_through     bigint      NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    checked_at        timestamptz,
    scope             regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_attempts_pkey PRIMARY KEY (attempt_id),
    CONSTRAINT idem_attempts_request_unique UNIQUE (kind, target, client_request_id, scope),
    CONSTRAINT idem_attempts_kind_fkey FOREIGN KEY (kind)
        REFERENCES idem_attempt_kinds (kind),
    CONSTRAINT idem_attempts_status CHECK (status OPERATOR(pg_catalog.=) ANY (ARRAY
        ['pending', 'stored', 'promoted', 'superseded', 'failed']::pg_catalog.text[])),
    CONSTRAINT idem_attempts_failure_reason CHECK (
        CASE WHEN status OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
             THEN failure_reason OPERATOR(pg_catalog.=) ANY (ARRAY
                  ['reaped_no_blob', 'digest_mismatch', 'target_gone']::pg_catalog.text[])
             ELSE failure_reason IS NULL END),
    CONSTRAINT idem_attempts_generation CHECK (generation OPERATOR(pg_catalog.>=) 1),
    CONSTRAINT idem_attempts_stored_has_digest
        CHECK (status OPERATOR(pg_catalog.<>) ALL (ARRAY['stored', 'promoted', 'superseded']::pg_catalog.text[])
               OR declared_digest IS NOT NULL),
    CONSTRAINT idem_attempts_superseded_by
        CHECK ((status OPERATOR(pg_catalog.=) 'superseded'::pg_catalog.text)
               OPERATOR(pg_catalog.=) (superseded_by IS NOT NULL)),
    CONSTRAINT idem_attempts_intent_hash_length
        CHECK (pg_catalog.octet_length(intent_hash) OPERATOR(pg_catalog.=) 32),
    CONSTRAINT idem_attempts_declared_digest_length
        CHECK (declared_digest IS NULL OR pg_catalog.octet_length(declared_digest) OPERATOR(pg_catalog.=) 32),
    CONSTRAINT idem_attempts_target_length
        CHECK (pg_catalog.octet_length(target) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(target) OPERATOR(pg_catalog.<=) 512),
    CONSTRAINT idem_attempts_client_request_id_length
        CHECK (pg_catalog.octet_length(client_request_id) OPERATOR(pg_catalog.>=) 1
               AND pg_catalog.octet_length(client_request_id) OPERATOR(pg_catalog.<=) 255)
);
COMMENT ON TABLE idem_attempts IS
    'pg_idem: multi-step attempts; written only through the idem_attempt_* functions';
COMMENT ON COLUMN idem_attempts.intent_hash IS
    'SHA-256 of the jsonb text of intent (idem_intent_hash): key order and whitespace never change it';
COMMENT ON COLUMN idem_attempts.generation IS
    'fencing number: starts at 1, incremented only by a reopen, which rotates object_key';
COMMENT ON COLUMN idem_attempts.event_id IS
    'idem_outbox id of the promotion event: a promotion cannot commit without it';
COMMENT ON COLUMN idem_attempts.swept_through IS
    'blobs of generations up to this one were deleted by the reconciler';
COMMENT ON COLUMN idem_attempts.checked_at IS
    'last time a reconciler batch looked at the attempt (spaces out re-checks)';
COMMENT ON COLUMN idem_attempts.scope IS
    'the role whose attempt this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for attempts opened before 0.5.0, shared by every role';
COMMENT ON COLUMN idem_attempts.created_by IS
    'the caller''s principal, as it says: separates principals inside one role''s scope (forbidden), no boundary between roles';

-- What the reconciler selects: live attempts by the time they were last
-- changed or looked at.
CREATE INDEX idem_attempts_reconcile ON idem_attempts ((GREATEST(updated_at, checked_at)))
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'stored']::pg_catalog.text[]);
-- What the pruner selects: finished attempts by age.
CREATE INDEX idem_attempts_prune ON idem_attempts (updated_at)
    WHERE status OPERATOR(pg_catalog.=) ANY (ARRAY['promoted', 'superseded', 'failed']::pg_catalog.text[]);
-- What the sweeper selects: attempts with blobs of abandoned generations
-- (older generations, and the last one of a failed attempt) not yet deleted.
CREATE INDEX idem_attempts_sweep ON idem_attempts (updated_at)
    WHERE swept_through OPERATOR(pg_catalog.<)
          CASE WHEN status OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text THEN generation
               ELSE generation OPERATOR(pg_catalog.-) 1 END;

-- The current attempt of each replace-kind target.  The pointer is never
-- NULL and only moves forward in (created_at, attempt_id) order; a guard
-- trigger holds that for writes outside idem_attempt_promote too.
CREATE TABLE idem_attempt_targets (
    kind               text        NOT NULL,
    target             text        NOT NULL,
    current_attempt_id uuid        NOT NULL,
    current_created_at timestamptz NOT NULL,
    flipped_at         timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    scope              regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_attempt_targets_pkey PRIMARY KEY (kind, target, scope),
    CONSTRAINT idem_attempt_targets_kind_fkey FOREIGN KEY (kind)
        REFERENCES idem_attempt_kinds (kind)
);
COMMENT ON TABLE idem_attempt_targets IS
    'pg_idem: current promoted attempt of each replace-kind target, per scope';

SELECT pg_catalog.pg_extension_config_dump('idem_attempt_kinds', '');
SELECT pg_catalog.pg_extension_config_dump('idem_attempts', '');
SELECT pg_catalog.pg_extension_config_dump('idem_attempt_targets', '');

-- What idem_attempt_open answers.
CREATE TYPE idem_attempt_decision AS (
    decision           text,
    attempt_id         uuid,
    generation         bigint,
    status             text,
    failure_reason     text,
    next_step          text,
    object_key         text,
    declared_digest    bytea,
    current_attempt_id uuid,
    created_at         timestamptz
);
COMMENT ON TYPE idem_attempt_decision IS
    'decision: new, resume, promoted, superseded, mismatch, reopened, gone or forbidden';

CREATE FUNCTION idem_intent_hash(intent jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_intent_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_intent_hash(jsonb) IS
    'SHA-256 of the jsonb text output: key order and whitespace do not change it, 1.0 and 1 do';

CREATE FUNCTION idem_attempt_safe_name(name text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_attempt_safe_name'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_attempt_safe_name(text) IS
    'a client file name reduced to a safe object-key segment';

CREATE FUNCTION idem_attempt_object_key(key_prefix text, target text,
                                        attempt_id uuid, generation bigint,
                                        name text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_attempt_object_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_attempt_object_key(text, text, uuid, bigint, text) IS
    '{key_prefix}/{target}/{attempt_id}/g{generation}/{safe name}';

CREATE FUNCTION idem_attempt_register_kind(kind text, mode text, key_prefix text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_attempt_register_kind'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_register_kind(text, text, text) IS
    'register an attempt kind (append or replace) and its object-key prefix';

CREATE FUNCTION idem_attempt_open(kind text, target text, client_request_id text,
                                  created_by text, intent jsonb,
                                  object_name text DEFAULT 'object',
                                  declared_digest bytea DEFAULT NULL)
RETURNS idem_attempt_decision
AS 'MODULE_PATHNAME', 'idem_attempt_open'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_open(text, text, text, text, jsonb, text, bytea) IS
    'start or look up an attempt: the replay decision table';

CREATE FUNCTION idem_attempt_store(attempt_id uuid, generation bigint, digest bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_attempt_store'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_store(uuid, bigint, bytea) IS
    'CAS pending -> stored once the blob is in place with the declared digest';

CREATE FUNCTION idem_attempt_promote(attempt_id uuid, generation bigint, digest bytea,
                                     event_topic text DEFAULT NULL,
                                     event_payload jsonb DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_attempt_promote'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_promote(uuid, bigint, bytea, text, jsonb) IS
    'CAS stored -> promoted, replace-kind pointer flip and outbox event, in the caller''s transaction';

CREATE FUNCTION idem_attempt_fail(attempt_id uuid, generation bigint, reason text,
                                  event_payload jsonb DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_attempt_fail'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_fail(uuid, bigint, text, jsonb) IS
    'CAS pending|stored -> failed(reason) with its failure event';

CREATE FUNCTION idem_attempt_reopen(attempt_id uuid, generation bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_attempt_reopen'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_reopen(uuid, bigint) IS
    'CAS failed(reaped_no_blob|digest_mismatch) -> pending; the new generation, NULL if stale';

CREATE FUNCTION idem_attempt_current(kind text, target text)
RETURNS uuid
AS 'MODULE_PATHNAME', 'idem_attempt_current'
LANGUAGE C STABLE;
COMMENT ON FUNCTION idem_attempt_current(text, text) IS
    'the current promoted attempt of a replace-kind target, NULL if none';

-- The reconciler's side.
CREATE FUNCTION idem_attempt_reconcile_batch(grace interval DEFAULT '1 hour',
                                             batch integer DEFAULT 100,
                                             OUT attempt_id uuid,
                                             OUT generation bigint,
                                             OUT status text,
                                             OUT kind text,
                                             OUT mode text,
                                             OUT target text,
                                             OUT object_key text,
                                             OUT declared_digest bytea)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_attempt_reconcile_batch'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_reconcile_batch(interval, integer) IS
    'lock (SKIP LOCKED) pending and stored attempts idle for longer than grace';

CREATE FUNCTION idem_attempt_sweep_batch(grace interval DEFAULT '1 hour',
                                         batch integer DEFAULT 100,
                                         OUT attempt_id uuid,
                                         OUT generation bigint,
                                         OUT object_key text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_attempt_sweep_batch'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_sweep_batch(interval, integer) IS
    'object keys of abandoned generations still to delete (one row per key)';

CREATE FUNCTION idem_attempt_swept(attempt_id uuid, generation bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_attempt_swept'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_swept(uuid, bigint) IS
    'record that the blobs of generations up to generation are deleted';

CREATE FUNCTION idem_attempt_prune(retention interval DEFAULT '31 days',
                                   batch integer DEFAULT 100)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_attempt_prune'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_attempt_prune(interval, integer) IS
    'delete at most batch finished, swept attempts idle for longer than retention';

-- Guards that hold for every write, not only the functions' own.
CREATE FUNCTION idem_attempts_transition_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_attempts_transition_guard'
LANGUAGE C;

CREATE TRIGGER idem_attempts_transition_guard
    BEFORE UPDATE ON idem_attempts
    FOR EACH ROW
    EXECUTE FUNCTION idem_attempts_transition_guard();

-- Runs at commit as the extension's owner: it reads idem_outbox, which the
-- committing role may not.
CREATE FUNCTION idem_attempts_promotion_published()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_attempts_promotion_published'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Queued for every promotion and every change of a promoted row's event.
CREATE CONSTRAINT TRIGGER idem_attempts_promotion_published
    AFTER UPDATE ON idem_attempts
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status OPERATOR(pg_catalog.=) ANY (ARRAY['promoted', 'superseded']::pg_catalog.text[])
          AND (OLD.status OPERATOR(pg_catalog.<>) ALL (ARRAY['promoted', 'superseded']::pg_catalog.text[])
               OR NEW.event_id IS DISTINCT FROM OLD.event_id))
    EXECUTE FUNCTION idem_attempts_promotion_published();

CREATE FUNCTION idem_attempt_targets_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_attempt_targets_guard'
LANGUAGE C;

CREATE TRIGGER idem_attempt_targets_guard
    BEFORE UPDATE ON idem_attempt_targets
    FOR EACH ROW
    EXECUTE FUNCTION idem_attempt_targets_guard();

-- extension/install/70_version_guard.sql
-- Row-version guard (version_guard.c): If-Match style optimistic
-- concurrency for the application's own tables.
--
--   ALTER TABLE docs ADD COLUMN version bigint NOT NULL DEFAULT 1;
--   CREATE TRIGGER docs_version BEFORE INSERT OR UPDATE ON docs
--       FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
--
--   UPDATE docs SET body = $2, version = $3 WHERE id = $1 RETURNING version;
--
-- A write whose version is not the row's raises IL004 (stale row version)
-- and writes nothing; every write bumps the version by one.  The trigger's
-- optional argument names another column: idem_version_guard('revision').

CREATE FUNCTION idem_version_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_version_guard'
LANGUAGE C;
COMMENT ON FUNCTION idem_version_guard() IS
    'BEFORE INSERT OR UPDATE trigger: a stale version raises IL004, every write bumps it';

-- extension/install/80_operations.sql
-- What operators look at: statistics, keys in flight, stuck or cooling
-- down, and eviction of one key.  No view shows response bodies.
--
-- The views' expressions are resolved here, with the search_path set to
-- this schema (pg_catalog implicitly first): every function and operator
-- is named with its schema, so that nothing another role created here or
-- in public can be chosen.

-- The view over idem_stats() must refer to the function itself: called by
-- name, a function of another role's in this schema with the same leading
-- parameters and one more, defaulted, would make "idem_stats()" ambiguous
-- and this script fail.  So the function is created under a name nobody
-- can have guessed, the view is defined over it, and only then is it
-- renamed (a view refers to its functions by OID).
DO $stats_view$
DECLARE
    hidden CONSTANT text := pg_catalog.format('idem_stats_%s',
        pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text));
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE FUNCTION @extschema@.%I(OUT counter pg_catalog.text, OUT value pg_catalog.int8,'
        ' OUT stats_reset pg_catalog.timestamptz) RETURNS SETOF pg_catalog.record'
        ' AS %L, %L LANGUAGE C VOLATILE', hidden, 'MODULE_PATHNAME', 'idem_stats');
    EXECUTE pg_catalog.format('CREATE VIEW @extschema@.idem_stats AS'
                              ' SELECT * FROM @extschema@.%I() AS idem_stats', hidden);
    EXECUTE pg_catalog.format('ALTER FUNCTION @extschema@.%I() RENAME TO idem_stats', hidden);
END
$stats_view$;
COMMENT ON VIEW idem_stats IS
    'pg_idem event counters since stats_reset (needs shared_preload_libraries)';

CREATE FUNCTION idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_stats_reset() IS 'zero every pg_idem counter';

CREATE FUNCTION idem_evict(cache_key bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_evict'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_evict(bytea) IS
    'forget one key whatever its state (the next request runs afresh)';

-- Each operator view names the role a row belongs to (scope::regrole: the
-- role's current name, its OID once it was dropped, '-' for the shared
-- scope of rows from before 0.3.0).
CREATE VIEW idem_inflight AS
SELECT cache_key, generation, in_transaction, created_at, lease_expires_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS lease_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_inflight IS 'keys whose handler holds a live lease';

CREATE VIEW idem_stuck AS
SELECT cache_key, generation, created_at, lease_expires_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) lease_expires_at AS expired_for,
       scope::pg_catalog.regrole AS scope,
       pg_catalog.count(*) OVER (PARTITION BY scope) AS stuck_in_scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_stuck IS
    'pending keys past their lease: the owner died or stalled; the next same request recovers them (stuck_in_scope: how many the row''s scope has)';

CREATE VIEW idem_cooling AS
SELECT cache_key, generation, finished_at, lease_expires_at AS cooldown_ends_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS cooldown_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_cooling IS 'failed keys still in their cooldown';

CREATE VIEW idem_outbox_dead AS
SELECT id, topic, message_key, attempts, last_error, created_at, dead_at,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_outbox
 WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
COMMENT ON VIEW idem_outbox_dead IS
    'outbox events that used up their attempts (payloads stay in idem_outbox)';

CREATE VIEW idem_inbox_dead AS
SELECT consumer, message_id, error_count, max_attempts, last_error,
       received_at, failed_at, dead_at, scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_inbox
 WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
COMMENT ON VIEW idem_inbox_dead IS
    'inbox messages that reached their retry cap; revive one with idem_inbox_retry';

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
