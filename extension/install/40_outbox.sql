-- The transactional outbox: events staged in the caller's transaction and
-- published by drainers that claim them in batches under a fenced lease.
--
-- Three relations:
--  * idem_outbox_queue: events never claimed yet.  Insert-only for
--    stagers and delete-only for claims, packed full (fillfactor 100):
--    staging is the producers' hot path, inside their own transactions.
--    (With idem.outbox_archive = off nothing is kept after the ack, so
--    nothing moves: the C edition's claim leases the event in place here
--    and the ack deletes it, as up to 0.5.0.)
--  * idem_outbox_claimed: events a claim has taken at least once, moved
--    there by their first claim: leased, backing off, dead, and (for
--    idem.outbox_retention) published.  Half of each page is kept free
--    (fillfactor 50), so the ack's "published" and the nack's backoff are
--    updates on the row's own page, whose WAL record carries the changed
--    bytes only, never a second copy of the event.  With
--    idem.outbox_archive = off an ack deletes the event outright.
--  * idem_outbox, a view of both with 0.2.0's columns (plus scope), which
--    admins read and tests may edit by hand (INSTEAD OF triggers).
-- An event is in exactly one of the two tables (ids are unique across
-- both); per event the outbox writes the event twice, as pgmq's queue
-- does: once staged, once claimed (docs/benchmarks.md#the-outbox).

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
-- Default fillfactor (100) on purpose: staging by 4 clients on
-- PostgreSQL 15 ran at 0.57 x with room kept on each page (measured,
-- docs/benchmarks.md#the-outbox), and with the archive on no row of the
-- queue is ever updated (its first claim moves it to idem_outbox_claimed),
-- so free room would buy nothing here.
-- No CHECK constraints: PostgreSQL rebuilds them from their stored text
-- in every executor, and every stage is an executor of its own (the seven
-- of 0.2.0 cost more than half of a stage's CPU).  The functions are the
-- tables' only writers and enforce what they said: topic 1 .. 255 bytes,
-- exactly one of payload / payload_bytes, key_hash = SHA-256(message_key),
-- state pending, dead (dead_at set exactly for dead) or published
-- (published_at set exactly for published), attempts counted up at each
-- claim from 0 (a redrive starts them again at 0).
-- (Hand edits through idem_outbox are not checked.)
ALTER SEQUENCE idem_outbox_id_seq OWNED BY idem_outbox_queue.id;

COMMENT ON TABLE idem_outbox_queue IS
    'pg_idem: outbox events never claimed yet (a claim moves them to idem_outbox_claimed); written only through the idem_outbox_* functions';
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

-- Per-key commit order (issue 33): a stager of a keyed event first locks
-- its key's slot row FOR UPDATE, and only then draws the event's id, so a
-- second stager of the key waits for the first one's transaction to end
-- and its id (drawn after the wait) is higher: a key's id order is its
-- commit order.  The slot is a function of (scope, key_hash), so keys of
-- other scopes and other keys (but one in 16384 pairs, which then merely
-- take turns) never wait for each other.  A fixed set of rows that is only
-- ever locked, never written: no growth and nothing to prune, no insert
-- race for a key's first event, and a lock-only xmax, which REPEATABLE
-- READ and SERIALIZABLE stagers pass after the wait without a
-- serialization failure (an upsert's new version would raise one).  A row
-- lock is a heavyweight wait: lock_timeout bounds it and the deadlock
-- detector sees it.  Not dumped: CREATE EXTENSION makes the rows again.
CREATE TABLE idem_outbox_key_slots (
    slot integer NOT NULL,
    CONSTRAINT idem_outbox_key_slots_pkey PRIMARY KEY (slot)
);
INSERT INTO idem_outbox_key_slots (slot) SELECT pg_catalog.generate_series(0, 16383);
COMMENT ON TABLE idem_outbox_key_slots IS
    'pg_idem: rows a stager of a keyed outbox event locks until its commit, so that a key''s ids follow commit order (never written)';

CREATE TABLE idem_outbox_claimed (
    id            bigint      NOT NULL,
    topic         text        NOT NULL,
    message_key   text,
    key_hash      bytea,
    payload       jsonb,
    payload_bytes bytea,
    headers       jsonb,
    state         text        NOT NULL,
    attempts      integer     NOT NULL,
    last_error    text,
    available_at  timestamptz NOT NULL,
    claim_token   uuid,
    created_at    timestamptz NOT NULL,
    published_at  timestamptz,
    dead_at       timestamptz,
    scope         regrole     NOT NULL,
    CONSTRAINT idem_outbox_claimed_pkey PRIMARY KEY (id)
) WITH (fillfactor = 50);
-- The queue's columns in the queue's order: a claim moves a row across
-- as it is, with its lease.  Fillfactor 50, measured: the ack's update
-- stays on the page and writes 861 B per event's drain, against 1073 B at
-- 70 and 1254 B at 100, where it writes the row again on another page
-- (tests/bench/results/outbox_archive_designs.md).
COMMENT ON TABLE idem_outbox_claimed IS
    'pg_idem: outbox events claimed at least once: leased, backing off, dead, or published (kept for idem.outbox_retention); written only through the idem_outbox_* functions';
COMMENT ON COLUMN idem_outbox_claimed.state IS
    'pending (leased or backing off: available_at says until when), dead (attempts used up) or published';
-- The claim's second source, and the per-key order probe's: as the
-- queue's, for events that came back (an expired lease, a nack's backoff).
CREATE INDEX idem_outbox_claimed_claimable ON idem_outbox_claimed (scope, available_at, id)
    WHERE state = 'pending';
CREATE INDEX idem_outbox_claimed_key_order ON idem_outbox_claimed (key_hash, id)
    WHERE state = 'pending' AND key_hash IS NOT NULL;
-- The prune's range scan: events are published in about published_at order.
CREATE INDEX idem_outbox_claimed_published_at ON idem_outbox_claimed
    USING brin (published_at);
-- The prune's and the redrive's dead events: few, and an ack or a nack
-- that does not kill adds no entry.
CREATE INDEX idem_outbox_claimed_dead ON idem_outbox_claimed (dead_at)
    WHERE state = 'dead';

SELECT pg_catalog.pg_extension_config_dump('idem_outbox_queue', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_claimed', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_id_seq', '');

CREATE VIEW idem_outbox AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM idem_outbox_queue
UNION ALL
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM idem_outbox_claimed;
COMMENT ON VIEW idem_outbox IS
    'pg_idem: every outbox event, never claimed or claimed (the idem_outbox table of 0.2.0)';

-- 0.5.0's archive, as a view: the published events, with the archive's
-- columns, for the queries and dashboards written against the table.
CREATE VIEW idem_outbox_archive AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, attempts,
       last_error, available_at, claim_token, created_at, published_at, scope
  FROM idem_outbox_claimed
 WHERE state = 'published';
COMMENT ON VIEW idem_outbox_archive IS
    'pg_idem: published outbox events, kept for idem.outbox_retention (a table until 0.5.0; rows of idem_outbox_claimed since 0.6.0)';

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
    'publish the events among ids that the claim still holds (marked published, or deleted); returns how many';

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
