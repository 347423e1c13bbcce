-- minimal floor, renew: a bare primary-key UPDATE of lease_expires_at.
\set k random(1, 1000)
UPDATE bench.idem_minimal SET lease_expires_at = clock_timestamp() + interval '30 seconds'
 WHERE cache_key = sha256(int8send(:k));
