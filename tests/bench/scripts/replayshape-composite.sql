-- pg_idem, replay as one composite value: no FunctionScan (and no tuplestore)
-- around the call, the client reads the record.
\set k random(1, 10000)
SELECT idem_claim(sha256(int8send(:k)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '30 seconds');
