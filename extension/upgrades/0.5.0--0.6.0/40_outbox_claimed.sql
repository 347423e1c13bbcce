-- The outbox's claimed table (issue 35, install/40_outbox.sql says why):
-- a claim moves an event from the queue into idem_outbox_claimed, and an
-- ack marks it published there instead of copying it into the archive.
-- The update moves across every event a claim has taken (leased, backing
-- off, dead, or marked published in the queue by this library before the
-- update: outbox/outbox_queue.c) and the archive's rows, and makes the
-- archive a view of the published ones.  Both tables are locked first,
-- the queue before the archive (as the 0.6.0 library's prune takes them:
-- outbox_prune.c), so no claim, ack, nack or prune of the old tables runs
-- in between and none deadlocks with the update; those already waiting
-- go on against the new ones.  (A grant on the archive table is not
-- carried to the view: the update's privileges step grants what it
-- grants on every relation.)
LOCK TABLE @extschema@.idem_outbox_queue, @extschema@.idem_outbox_archive IN ACCESS EXCLUSIVE MODE;

CREATE TABLE @extschema@.idem_outbox_claimed (
    id            pg_catalog.int8        NOT NULL,
    topic         pg_catalog.text        NOT NULL,
    message_key   pg_catalog.text,
    key_hash      pg_catalog.bytea,
    payload       pg_catalog.jsonb,
    payload_bytes pg_catalog.bytea,
    headers       pg_catalog.jsonb,
    state         pg_catalog.text        NOT NULL,
    attempts      pg_catalog.int4        NOT NULL,
    last_error    pg_catalog.text,
    available_at  pg_catalog.timestamptz NOT NULL,
    claim_token   pg_catalog.uuid,
    created_at    pg_catalog.timestamptz NOT NULL,
    published_at  pg_catalog.timestamptz,
    dead_at       pg_catalog.timestamptz,
    scope         pg_catalog.regrole     NOT NULL,
    CONSTRAINT idem_outbox_claimed_pkey PRIMARY KEY (id)
) WITH (fillfactor = 50);
COMMENT ON TABLE @extschema@.idem_outbox_claimed IS
    'pg_idem: outbox events claimed at least once: leased, backing off, dead, or published (kept for idem.outbox_retention); written only through the idem_outbox_* functions';
COMMENT ON COLUMN @extschema@.idem_outbox_claimed.state IS
    'pending (leased or backing off: available_at says until when), dead (attempts used up) or published';
CREATE INDEX idem_outbox_claimed_claimable ON @extschema@.idem_outbox_claimed (scope, available_at, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text;
CREATE INDEX idem_outbox_claimed_key_order ON @extschema@.idem_outbox_claimed (key_hash, id)
    WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text AND key_hash IS NOT NULL;
CREATE INDEX idem_outbox_claimed_published_at ON @extschema@.idem_outbox_claimed
    USING brin (published_at);
CREATE INDEX idem_outbox_claimed_dead ON @extschema@.idem_outbox_claimed (dead_at)
    WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox_claimed', '');

WITH taken AS (
    DELETE FROM @extschema@.idem_outbox_queue q
     WHERE q.attempts OPERATOR(pg_catalog.>) 0 OR q.claim_token IS NOT NULL
        OR q.state OPERATOR(pg_catalog.<>) 'pending'::pg_catalog.text
    RETURNING q.*)
INSERT INTO @extschema@.idem_outbox_claimed
       (id, topic, message_key, key_hash, payload, payload_bytes, headers, state, attempts,
        last_error, available_at, claim_token, created_at, published_at, dead_at, scope)
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state, attempts,
       last_error, available_at, claim_token, created_at, published_at, dead_at, scope
  FROM taken;
INSERT INTO @extschema@.idem_outbox_claimed
       (id, topic, message_key, key_hash, payload, payload_bytes, headers, state, attempts,
        last_error, available_at, claim_token, created_at, published_at, dead_at, scope)
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
       'published'::pg_catalog.text, attempts, last_error, available_at, claim_token, created_at,
       published_at, NULL::pg_catalog.timestamptz, scope
  FROM @extschema@.idem_outbox_archive;

CREATE OR REPLACE VIEW @extschema@.idem_outbox AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM @extschema@.idem_outbox_queue
UNION ALL
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, state,
       attempts, last_error, available_at, claim_token, created_at, published_at,
       dead_at, scope
  FROM @extschema@.idem_outbox_claimed;
COMMENT ON VIEW @extschema@.idem_outbox IS
    'pg_idem: every outbox event, never claimed or claimed (the idem_outbox table of 0.2.0)';
-- Out of the extension first: that also takes it off pg_dump's list of
-- configuration tables (pg_extension.extconfig), which DROP TABLE leaves.
ALTER EXTENSION pg_idem DROP TABLE @extschema@.idem_outbox_archive;
DROP TABLE @extschema@.idem_outbox_archive;

-- 0.5.0's archive, as a view: the published events, with the archive's
-- columns, for the queries and dashboards written against the table.
CREATE VIEW @extschema@.idem_outbox_archive AS
SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, attempts,
       last_error, available_at, claim_token, created_at, published_at, scope
  FROM @extschema@.idem_outbox_claimed
 WHERE state OPERATOR(pg_catalog.=) 'published'::pg_catalog.text;
COMMENT ON VIEW @extschema@.idem_outbox_archive IS
    'pg_idem: published outbox events, kept for idem.outbox_retention (a table until 0.5.0; rows of idem_outbox_claimed since 0.6.0)';

COMMENT ON TABLE @extschema@.idem_outbox_queue IS
    'pg_idem: outbox events never claimed yet (a claim moves them to idem_outbox_claimed); written only through the idem_outbox_* functions';
COMMENT ON FUNCTION @extschema@.idem_outbox_ack(pg_catalog.uuid, pg_catalog.int8[]) IS
    'publish the events among ids that the claim still holds (marked published, or deleted); returns how many';
