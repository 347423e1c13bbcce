-- seed CTE, renew: the seed's owner-scoped renewal UPDATE.
\set k random(1, 1000)
UPDATE bench.idem_cte SET lease_expires_at = clock_timestamp() + (30::bigint * interval '1 second')
 WHERE cache_key = sha256(int8send(:k)) AND claim_id = md5(int8send(:k))::uuid AND state = 'pending';
