-- The growth section's helpers (tests/bench/growth.sh), after setup.sql.

-- idem_keys holds `backlog` completed keys past every horizon (two hours
-- old; the section's idem.ttl and idem.tombstone_ttl are one hour) and
-- `live` completed keys of now, rows exactly as idem_finalize leaves them
-- (bench.reset's shape; key i is sha256(int8send(i))).  The old keys come
-- first in the heap, as they do in a table filled over time.
CREATE FUNCTION bench.growth_seed(live integer, backlog integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE idem_keys;
    INSERT INTO idem_keys (cache_key, scope, state, request_hash, claim_id, generation,
                           created_at, finished_at, response_status, response_headers, response_body)
    SELECT sha256(int8send(i)), current_user::text::regrole, 'completed',
           '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9',
           md5(int8send(i))::uuid, i, t, t, 200,
           '{"content-type": "application/json"}', '{"id": 42, "status": "created"}'
      FROM generate_series(1, live + backlog) i,
           LATERAL (SELECT CASE WHEN i <= backlog THEN clock_timestamp() - interval '2 hours'
                                ELSE clock_timestamp() END AS t) times;
END
$$;

-- The pacing rounds' refill: the backlog keys the cleanup deleted in the
-- last phase, back as they were (two hours old, completed), so that every
-- phase starts with the same backlog; returns how many came back.
CREATE FUNCTION bench.growth_refill(backlog integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH refilled AS (
        INSERT INTO idem_keys (cache_key, scope, state, request_hash, claim_id, generation,
                               created_at, finished_at, response_status, response_headers, response_body)
        SELECT sha256(int8send(i)), current_user::text::regrole, 'completed',
               '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9',
               md5(int8send(i))::uuid, i, clock_timestamp() - interval '2 hours',
               clock_timestamp() - interval '2 hours', 200,
               '{"content-type": "application/json"}', '{"id": 42, "status": "created"}'
          FROM generate_series(1, backlog) i
        ON CONFLICT DO NOTHING
        RETURNING 1)
    SELECT count(*) FROM refilled
$$;

-- The pile-up's controls (what the claims' p99 during the cleanup is made
-- of).  burn_cpu spends `secs` seconds of one backend's CPU and writes
-- nothing: the cleanup's share of a core without its WAL, its locks or its
-- buffer traffic.
CREATE FUNCTION bench.burn_cpu(secs double precision)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    stop timestamptz := clock_timestamp() + secs * interval '1 second';
    n bigint := 0;
BEGIN
    WHILE clock_timestamp() < stop LOOP
        FOR i IN 1..10000 LOOP
            n := n + 1;
        END LOOP;
    END LOOP;
    RETURN n;
END
$$;

-- What the claim backends (pgbench's) are doing, sampled every 10 ms for
-- `secs` seconds: wait_event_type:wait_event of each active one, 'CPU' for
-- one with no wait event (running, or runnable and waiting for a core).
-- A temporary table holds the samples: it writes no WAL.
CREATE FUNCTION bench.sample_waits(secs double precision)
RETURNS TABLE (wait text, samples bigint)
LANGUAGE plpgsql AS $$
DECLARE
    stop timestamptz := clock_timestamp() + secs * interval '1 second';
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS pg_temp.samples (wait text);
    TRUNCATE pg_temp.samples;
    WHILE clock_timestamp() < stop LOOP
        PERFORM pg_stat_clear_snapshot();
        INSERT INTO pg_temp.samples
        SELECT coalesce(a.wait_event_type || ':' || a.wait_event, 'CPU')
          FROM pg_stat_activity a
         WHERE a.application_name = 'pgbench' AND a.state = 'active';
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN QUERY SELECT s.wait, count(*) FROM pg_temp.samples s GROUP BY s.wait ORDER BY 2 DESC;
END
$$;

-- write_wal writes `mb_per_s` MB of WAL per second for `secs` seconds and
-- nothing else: 8 kB non-transactional logical messages (the size of the
-- full-page image most of the cleanup's WAL is), paced every 10 ms.  The
-- cleanup's WAL volume without its deletes, its CPU share only what writing
-- the bytes costs.
CREATE FUNCTION bench.write_wal(mb_per_s double precision, secs double precision)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    start timestamptz := clock_timestamp();
    stop timestamptz := start + secs * interval '1 second';
    page text := repeat('x', 8000);
    written bigint := 0;
BEGIN
    WHILE clock_timestamp() < stop LOOP
        WHILE written < mb_per_s * 1048576
                        * extract(epoch FROM clock_timestamp() - start) LOOP
            PERFORM pg_logical_emit_message(false, 'bench', page);
            written := written + 8000;
        END LOOP;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN written;
END
$$;
