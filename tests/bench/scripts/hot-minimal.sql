-- minimal floor, hot keys: the floor's bare insert-if-absent and, for a
-- winner, a bare DELETE, on bench.idem_minimal.
\set k random(1, :hot)
\set r random(1, 9223372036854775806)
\set won 0
INSERT INTO bench.idem_minimal (cache_key, state, request_hash, claim_id, generation, lease_expires_at)
VALUES (sha256(int8send(:k)), 'pending', '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, md5(int8send(:r))::uuid, 1, clock_timestamp() + interval '5 milliseconds')
ON CONFLICT (cache_key, scope) DO NOTHING RETURNING 1 AS won \aset
\if :won
DELETE FROM bench.idem_minimal WHERE cache_key = sha256(int8send(:k));
\endif
