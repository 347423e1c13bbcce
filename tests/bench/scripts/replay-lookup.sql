-- probe: idem_lookup, pg_idem's read-only look at a key (the same SPI read
-- as idem_claim's, without the claim's write path), on the replay rows.
\set k random(1, 10000)
SELECT * FROM idem_lookup(sha256(int8send(:k)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea);
