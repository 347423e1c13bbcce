-- The outbox's archive, three designs in plain SQL on tables of
-- idem_outbox_queue's shape (tests/bench/outbox_archive_designs.sh runs
-- it, in a database with pg_idem created): WAL per event of one client
-- staging 20000 events by 100 and then claiming and acking them by 100,
-- each step its own transaction.
--   psql -v design=floor|today|inflight -v archive=on|off -v ff=N -v label=TEXT
--  * floor: pgmq's shape (one table, FOR UPDATE SKIP LOCKED, a visibility
--    time, a delete), the baseline of issue 35's WAL target;
--  * today: 0.6.0's queue; the claim updates the event (lease, token), the
--    ack deletes it and, archive on, inserts its copy into the archive;
--  * inflight: the claim moves the event into a second table kept at
--    fillfactor ff, the ack marks it published there (an update on its
--    page, no copy).  What a redesign of the archive would write.
\set payload '{"order_id": 123456789, "customer_id": 987654, "status": "created", "currency": "EUR", "amount_cents": 129900, "items": [{"sku": "SKU-000123", "qty": 2}, {"sku": "SKU-004567", "qty": 1}], "note": "leave at the door"}'
SET bench.payload TO :'payload';
SET bench.design TO :'design';
SET bench.archive TO :'archive';
SET client_min_messages TO warning;
DROP SCHEMA IF EXISTS designs CASCADE;
CREATE SCHEMA designs;
CREATE TABLE designs.floor (
    msg_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, read_ct integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(), vt timestamptz NOT NULL, message jsonb);
CREATE INDEX ON designs.floor (vt);
-- The queue and the archive are pg_idem's own tables' copies (columns,
-- defaults, indexes), so that this stays their shape.
CREATE TABLE designs.queue (LIKE idem_outbox_queue INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TABLE designs.archive (LIKE idem_outbox_archive INCLUDING DEFAULTS INCLUDING INDEXES);
-- In flight: leased events (published_at null, found by lease expiry for a
-- re-claim) and published ones (kept for the retention).
CREATE TABLE designs.inflight (LIKE idem_outbox_queue INCLUDING DEFAULTS) WITH (fillfactor = :ff);
ALTER TABLE designs.inflight ADD PRIMARY KEY (id);
CREATE INDEX ON designs.inflight (scope, available_at, id) WHERE published_at IS NULL;
CREATE INDEX ON designs.inflight USING brin (published_at);

CREATE PROCEDURE designs.stage() LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 200 LOOP
        IF current_setting('bench.design') = 'floor' THEN
            INSERT INTO designs.floor (vt, message)
            SELECT clock_timestamp(), current_setting('bench.payload')::jsonb FROM generate_series(1, 100);
        ELSE
            INSERT INTO designs.queue (topic, payload, available_at, scope)
            SELECT 'orders', current_setting('bench.payload')::jsonb, clock_timestamp(),
                   current_user::text::regrole
              FROM generate_series(1, 100);
        END IF;
        COMMIT;
    END LOOP;
END $$;

CREATE PROCEDURE designs.drain() LANGUAGE plpgsql AS $$
DECLARE
    token uuid;
    ids bigint[];
BEGIN
    FOR i IN 1 .. 200 LOOP
        token := gen_random_uuid();
        IF current_setting('bench.design') = 'floor' THEN
            WITH c AS (SELECT msg_id FROM designs.floor WHERE vt <= clock_timestamp()
                        ORDER BY msg_id LIMIT 100 FOR UPDATE SKIP LOCKED),
                 u AS (UPDATE designs.floor m SET vt = clock_timestamp() + interval '30 s',
                              read_ct = read_ct + 1
                         FROM c WHERE m.msg_id = c.msg_id RETURNING m.msg_id)
            SELECT array_agg(msg_id) INTO ids FROM u;
        ELSIF current_setting('bench.design') = 'today' THEN
            WITH c AS (SELECT id FROM designs.queue WHERE state = 'pending'
                          AND scope = current_user::text::regrole
                          AND available_at <= clock_timestamp()
                        ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
                 u AS (UPDATE designs.queue q SET available_at = clock_timestamp() + interval '30 s',
                              claim_token = token, attempts = attempts + 1
                         FROM c WHERE q.id = c.id RETURNING q.id)
            SELECT array_agg(id) INTO ids FROM u;
        ELSE
            WITH c AS (SELECT id FROM designs.queue WHERE state = 'pending'
                          AND scope = current_user::text::regrole
                          AND available_at <= clock_timestamp()
                        ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED),
                 d AS (DELETE FROM designs.queue q USING c WHERE q.id = c.id RETURNING q.*),
                 m AS (INSERT INTO designs.inflight (id, topic, message_key, key_hash, payload,
                                                     payload_bytes, headers, state, attempts,
                                                     last_error, available_at, claim_token,
                                                     created_at, scope)
                       SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,
                              state, attempts + 1, last_error,
                              clock_timestamp() + interval '30 s', token, created_at, scope
                         FROM d
                       RETURNING id)
            SELECT array_agg(id) INTO ids FROM m;
        END IF;
        COMMIT;
        IF current_setting('bench.design') = 'floor' THEN
            DELETE FROM designs.floor WHERE msg_id = ANY (ids);
        ELSIF current_setting('bench.design') = 'inflight' THEN
            UPDATE designs.inflight SET published_at = clock_timestamp(), claim_token = NULL
             WHERE id = ANY (ids) AND claim_token = token;
        ELSIF current_setting('bench.archive') = 'on' THEN
            WITH d AS (DELETE FROM designs.queue WHERE id = ANY (ids) AND claim_token = token
                       RETURNING *)
            INSERT INTO designs.archive (id, topic, message_key, key_hash, payload, payload_bytes,
                                         headers, attempts, last_error, available_at, claim_token,
                                         created_at, published_at, scope)
            SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers, attempts,
                   last_error, available_at, claim_token, created_at, clock_timestamp(), scope
              FROM d;
        ELSE
            DELETE FROM designs.queue WHERE id = ANY (ids) AND claim_token = token;
        END IF;
        COMMIT;
    END LOOP;
END $$;

CHECKPOINT;
SELECT pg_current_wal_lsn() AS l0 \gset
CALL designs.stage();
SELECT pg_current_wal_lsn() AS l1 \gset
CALL designs.drain();
SELECT pg_current_wal_lsn() AS l2 \gset
-- Every event consumed, and where it ended.
SELECT :'label', pg_wal_lsn_diff(:'l2', :'l0')::bigint / 20000, pg_wal_lsn_diff(:'l1', :'l0')::bigint / 20000,
       pg_wal_lsn_diff(:'l2', :'l1')::bigint / 20000,
       (SELECT count(*) FROM designs.floor) + (SELECT count(*) FROM designs.queue),
       (SELECT count(*) FROM designs.archive) + (SELECT count(*) FROM designs.inflight WHERE published_at IS NOT NULL);
