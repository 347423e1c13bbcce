-- pg_idem 0.2.0: frozen as released; never edit (new changes go into the next version's pieces)
\echo Use "CREATE EXTENSION pg_idem" or "ALTER EXTENSION pg_idem UPDATE" to load this file. \quit

-- extension/sql/10_keys.sql
-- State of every idempotency key: one row per key, keyed by a SHA-256
-- digest so that no caller-controlled string ever reaches the index.
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
    CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key),
    CONSTRAINT idem_keys_state CHECK (state IN ('pending', 'completed', 'failed')),
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

-- extension/sql/20_claims.sql
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
                           lease interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_claim(bytea, bytea, interval) IS
    'claim a key for one execution, or learn what a follower should do';

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
    'delete at most batch finished keys older than idem.ttl';

-- extension/sql/30_in_transaction.sql
-- In-transaction mode: the claim, the handler's writes and the finalize
-- commit together, in the caller's transaction.

CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea,
                           lease interval DEFAULT NULL)
RETURNS idem_claim_result
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_begin(bytea, bytea, interval) IS
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

-- extension/sql/40_outbox.sql
-- The transactional outbox: events staged in the caller's transaction and
-- published by drainers that claim them in batches under a fenced lease.

-- An event's id orders it: per-key order is id order.  An explicit
-- sequence (not an identity) so that pg_dump keeps its position.
CREATE SEQUENCE idem_outbox_id_seq AS bigint;

CREATE TABLE idem_outbox (
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
    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id),
    CONSTRAINT idem_outbox_state CHECK (state IN ('pending', 'published', 'dead')),
    CONSTRAINT idem_outbox_one_payload CHECK ((payload IS NULL) <> (payload_bytes IS NULL)),
    CONSTRAINT idem_outbox_key_hashed
        CHECK ((message_key IS NULL) = (key_hash IS NULL)
               AND (key_hash IS NULL OR octet_length(key_hash) = 32)),
    CONSTRAINT idem_outbox_topic_length CHECK (octet_length(topic) BETWEEN 1 AND 255),
    CONSTRAINT idem_outbox_attempts CHECK (attempts >= 0),
    CONSTRAINT idem_outbox_published_at CHECK ((state = 'published') = (published_at IS NOT NULL)),
    CONSTRAINT idem_outbox_dead_at CHECK ((state = 'dead') = (dead_at IS NOT NULL))
);
ALTER SEQUENCE idem_outbox_id_seq OWNED BY idem_outbox.id;

COMMENT ON TABLE idem_outbox IS
    'pg_idem: outbox events; written only through the idem_outbox_* functions';
COMMENT ON COLUMN idem_outbox.available_at IS
    'when the event can next be claimed: staging delay, nack backoff, or the end of the current lease';
COMMENT ON COLUMN idem_outbox.attempts IS
    'publish attempts so far, counted when a drainer claims the event';
COMMENT ON COLUMN idem_outbox.key_hash IS
    'SHA-256 of message_key: the caller''s string itself is never indexed';

-- What a claim scans: pending events in the order they become claimable.
CREATE INDEX idem_outbox_claimable ON idem_outbox (available_at, id)
    WHERE state = 'pending';
-- The per-key order probe: is an earlier event of this key still pending?
CREATE INDEX idem_outbox_key_order ON idem_outbox (key_hash, id)
    WHERE state = 'pending' AND key_hash IS NOT NULL;

SELECT pg_catalog.pg_extension_config_dump('idem_outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_id_seq', '');

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
    'stage an event with a binary payload in the caller''s transaction; returns its id';

CREATE FUNCTION idem_outbox_claim(batch integer, lease interval DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, payload_bytes bytea,
               headers jsonb, attempts integer, created_at timestamptz,
               claim_token uuid, lease_expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_claim'
LANGUAGE C VOLATILE ROWS 100;
COMMENT ON FUNCTION idem_outbox_claim(integer, interval) IS
    'lease at most batch claimable events to a fresh claim token (run in its own transaction)';

CREATE FUNCTION idem_outbox_ack(token uuid, ids bigint[])
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_outbox_ack(uuid, bigint[]) IS
    'mark published the events among ids that the claim still holds; returns how many';

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
    'true as soon as an event is claimable, false after timeout (adaptive poll, no NOTIFY)';

-- extension/sql/50_inbox.sql
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
    CONSTRAINT idem_inbox_pkey PRIMARY KEY (inbox_key),
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

-- extension/sql/60_attempts.sql
-- Multi-step attempts (attempts.c): an upload or an export that writes a
-- blob outside the database and then publishes it, driven by a state
-- machine whose every transition is a status + generation CAS.
--
--   pending --store--> stored --promote--> promoted --(newer winner)--> superseded
--      |                  |
--      |                  +--fail(target_gone)--> failed
--      +--fail(reaped_no_blob | digest_mismatch | target_gone)--> failed
--   failed(reaped_no_blob | digest_mismatch) --reopen: generation + 1--> pending
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
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT idem_attempt_kinds_pkey PRIMARY KEY (kind),
    CONSTRAINT idem_attempt_kinds_mode CHECK (mode IN ('append', 'replace')),
    CONSTRAINT idem_attempt_kinds_kind_format CHECK (kind ~ '^[a-z][a-z0-9_]{0,62}$'),
    CONSTRAINT idem_attempt_kinds_key_prefix_length CHECK (octet_length(key_prefix) <= 255)
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
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    checked_at        timestamptz,
    CONSTRAINT idem_attempts_pkey PRIMARY KEY (attempt_id),
    CONSTRAINT idem_attempts_request_unique UNIQUE (kind, target, client_request_id),
    CONSTRAINT idem_attempts_kind_fkey FOREIGN KEY (kind)
        REFERENCES idem_attempt_kinds (kind),
    CONSTRAINT idem_attempts_status CHECK (status IN
        ('pending', 'stored', 'promoted', 'superseded', 'failed')),
    CONSTRAINT idem_attempts_failure_reason CHECK (
        CASE WHEN status = 'failed'
             THEN failure_reason IN ('reaped_no_blob', 'digest_mismatch', 'target_gone')
             ELSE failure_reason IS NULL END),
    CONSTRAINT idem_attempts_generation CHECK (generation >= 1),
    CONSTRAINT idem_attempts_stored_has_digest
        CHECK (status NOT IN ('stored', 'promoted', 'superseded') OR declared_digest IS NOT NULL),
    CONSTRAINT idem_attempts_superseded_by CHECK ((status = 'superseded') = (superseded_by IS NOT NULL)),
    CONSTRAINT idem_attempts_intent_hash_length CHECK (octet_length(intent_hash) = 32),
    CONSTRAINT idem_attempts_declared_digest_length
        CHECK (declared_digest IS NULL OR octet_length(declared_digest) = 32),
    CONSTRAINT idem_attempts_target_length CHECK (octet_length(target) BETWEEN 1 AND 512),
    CONSTRAINT idem_attempts_client_request_id_length
        CHECK (octet_length(client_request_id) BETWEEN 1 AND 255)
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

-- What the reconciler selects: live attempts by the time they were last
-- changed or looked at.
CREATE INDEX idem_attempts_reconcile ON idem_attempts ((GREATEST(updated_at, checked_at)))
    WHERE status IN ('pending', 'stored');
-- What the pruner selects: finished attempts by age.
CREATE INDEX idem_attempts_prune ON idem_attempts (updated_at)
    WHERE status IN ('promoted', 'superseded', 'failed');
-- What the sweeper selects: attempts with blobs of abandoned generations
-- (older generations, and the last one of a failed attempt) not yet deleted.
CREATE INDEX idem_attempts_sweep ON idem_attempts (updated_at)
    WHERE swept_through < CASE WHEN status = 'failed' THEN generation ELSE generation - 1 END;

-- The current attempt of each replace-kind target.  The pointer is never
-- NULL and only moves forward in (created_at, attempt_id) order; a guard
-- trigger holds that for writes outside idem_attempt_promote too.
CREATE TABLE idem_attempt_targets (
    kind               text        NOT NULL,
    target             text        NOT NULL,
    current_attempt_id uuid        NOT NULL,
    current_created_at timestamptz NOT NULL,
    flipped_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT idem_attempt_targets_pkey PRIMARY KEY (kind, target),
    CONSTRAINT idem_attempt_targets_kind_fkey FOREIGN KEY (kind)
        REFERENCES idem_attempt_kinds (kind)
);
COMMENT ON TABLE idem_attempt_targets IS
    'pg_idem: current promoted attempt of each replace-kind target';

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
    WHEN (NEW.status IN ('promoted', 'superseded')
          AND (OLD.status NOT IN ('promoted', 'superseded')
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

-- extension/sql/70_version_guard.sql
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

-- extension/sql/80_operations.sql
-- What operators look at: statistics, keys in flight, stuck or cooling
-- down, and eviction of one key.  No view shows response bodies.

CREATE FUNCTION idem_stats(OUT counter text, OUT value bigint,
                           OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C VOLATILE;

CREATE VIEW idem_stats AS SELECT * FROM idem_stats();
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

CREATE VIEW idem_inflight AS
SELECT cache_key, generation, in_transaction, created_at, lease_expires_at,
       lease_expires_at - clock_timestamp() AS lease_remaining
  FROM idem_keys
 WHERE state = 'pending' AND lease_expires_at >= clock_timestamp();
COMMENT ON VIEW idem_inflight IS 'keys whose handler holds a live lease';

CREATE VIEW idem_stuck AS
SELECT cache_key, generation, created_at, lease_expires_at,
       clock_timestamp() - lease_expires_at AS expired_for
  FROM idem_keys
 WHERE state = 'pending' AND lease_expires_at < clock_timestamp();
COMMENT ON VIEW idem_stuck IS
    'pending keys past their lease: the owner died or stalled; the next same request recovers them';

CREATE VIEW idem_cooling AS
SELECT cache_key, generation, finished_at, lease_expires_at AS cooldown_ends_at,
       lease_expires_at - clock_timestamp() AS cooldown_remaining
  FROM idem_keys
 WHERE state = 'failed' AND lease_expires_at > clock_timestamp();
COMMENT ON VIEW idem_cooling IS 'failed keys still in their cooldown';

CREATE VIEW idem_outbox_dead AS
SELECT id, topic, message_key, attempts, last_error, created_at, dead_at
  FROM idem_outbox
 WHERE state = 'dead';
COMMENT ON VIEW idem_outbox_dead IS
    'outbox events that used up their attempts (payloads stay in idem_outbox)';

CREATE VIEW idem_inbox_dead AS
SELECT consumer, message_id, error_count, max_attempts, last_error,
       received_at, failed_at, dead_at
  FROM idem_inbox
 WHERE state = 'dead';
COMMENT ON VIEW idem_inbox_dead IS
    'inbox messages that reached their retry cap; revive one with idem_inbox_retry';

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

DO $privileges$
DECLARE
    -- The request path: what an application role needs.
    client_functions CONSTANT text[] := ARRAY[
        'idem_key', 'idem_request_hash',
        'idem_claim', 'idem_begin', 'idem_lookup', 'idem_renew',
        'idem_finalize', 'idem_release', 'idem_fail',
        'idem_outbox_stage', 'idem_outbox_claim', 'idem_outbox_ack',
        'idem_outbox_nack', 'idem_outbox_wait',
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
