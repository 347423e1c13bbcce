-- seed CTE, new-key cycle: the claim CTE of a service's hand-written design
-- (the seed pg_idem replaces) sent as client SQL
-- (client-generated claim id, lease in whole seconds), then the seed's
-- owner-scoped finalize.
\set r random(1, 9223372036854775806)
WITH ins AS (
    INSERT INTO bench.idem_cte
        (cache_key, state, request_hash, claim_id, generation, lease_expires_at, created_at)
    VALUES (sha256(int8send(:r)), 'pending', '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, md5(int8send(:r))::uuid, 1, clock_timestamp() + (30::bigint * interval '1 second'), clock_timestamp())
    ON CONFLICT (cache_key, scope) DO NOTHING
    RETURNING 'claimed'::text AS how
),
ttl AS (
    UPDATE bench.idem_cte k SET state = 'pending', request_hash = '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, claim_id = md5(int8send(:r))::uuid,
        generation = k.generation + 1, lease_expires_at = clock_timestamp() + (30::bigint * interval '1 second'),
        response_status = NULL, response_body = NULL, response_headers = NULL,
        replayable = true, created_at = clock_timestamp(), finished_at = NULL
      WHERE k.cache_key = sha256(int8send(:r)) AND NOT EXISTS (SELECT 1 FROM ins)
        AND k.created_at < clock_timestamp() - interval '24 hours'
    RETURNING 'recovered_ttl'::text AS how
),
steal AS (
    UPDATE bench.idem_cte k SET state = 'pending', request_hash = '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, claim_id = md5(int8send(:r))::uuid,
        generation = k.generation + 1, lease_expires_at = clock_timestamp() + (30::bigint * interval '1 second'),
        response_status = NULL, response_body = NULL, response_headers = NULL,
        replayable = true, created_at = clock_timestamp(), finished_at = NULL
      WHERE k.cache_key = sha256(int8send(:r)) AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM ttl)
        AND k.created_at >= clock_timestamp() - interval '24 hours'
        AND k.state IN ('pending', 'failed') AND k.lease_expires_at < clock_timestamp()
        AND k.request_hash = '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea
    RETURNING 'recovered_abandoned'::text AS how
)
SELECT how FROM ins UNION ALL SELECT how FROM ttl UNION ALL SELECT how FROM steal;
UPDATE bench.idem_cte SET state = 'completed', response_status = 200, response_headers = '{"content-type": "application/json"}'::jsonb,
    response_body = '{"id": 42, "status": "created"}'::bytea, replayable = true, finished_at = clock_timestamp(), lease_expires_at = NULL
 WHERE cache_key = sha256(int8send(:r)) AND claim_id = md5(int8send(:r))::uuid AND state = 'pending';
