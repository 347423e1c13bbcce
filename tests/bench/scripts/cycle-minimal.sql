-- minimal floor, new-key cycle: the floor's bare INSERT of the pending row
-- and bare UPDATE by key, on bench.idem_minimal (idem_keys' columns and
-- primary key only: no CHECK constraints, no trigger, fillfactor 70).
\set r random(1, 9223372036854775806)
INSERT INTO bench.idem_minimal (cache_key, state, request_hash, claim_id, generation, lease_expires_at)
VALUES (sha256(int8send(:r)), 'pending', '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, md5(int8send(:r))::uuid, 1, clock_timestamp() + interval '30 seconds');
UPDATE bench.idem_minimal SET state = 'completed', response_status = 200, response_headers = '{"content-type": "application/json"}'::jsonb,
    response_body = '{"id": 42, "status": "created"}'::bytea, replayable = true, finished_at = clock_timestamp(), lease_expires_at = NULL
 WHERE cache_key = sha256(int8send(:r));
