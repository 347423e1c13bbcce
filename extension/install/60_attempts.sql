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
