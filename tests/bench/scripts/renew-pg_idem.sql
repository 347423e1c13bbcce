-- pg_idem, renew.
\set k random(1, 1000)
SELECT idem_renew(sha256(int8send(:k)), md5(int8send(:k))::uuid, interval '30 seconds');
