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

-- How many keys past the horizons are left (what the cleaner has not yet deleted).
CREATE FUNCTION bench.growth_backlog()
RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM idem_keys WHERE created_at < clock_timestamp() - interval '90 minutes'
$$;
