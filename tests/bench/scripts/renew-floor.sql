-- floor, renew: a bare UPDATE of the lease by key.
\set k random(1, 1000)
UPDATE bench.idem_floor SET lease_expires_at = clock_timestamp() + interval '30 seconds'
 WHERE cache_key = sha256(int8send(:k));
