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
