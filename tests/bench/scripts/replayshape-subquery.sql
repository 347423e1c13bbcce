-- pg_idem, replay through a subquery that keeps the call single (OFFSET 0):
-- a Result under a SubqueryScan instead of a FunctionScan.
\set k random(1, 10000)
SELECT (r).* FROM (SELECT idem_claim(sha256(int8send(:k)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '30 seconds') AS r OFFSET 0) s;
