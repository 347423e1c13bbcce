-- pg_idem, one hot completed key: every client replays the same key.
SELECT * FROM idem_claim(sha256(int8send(1::bigint)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '30 seconds');
