-- pg_idem, in-transaction mode: BEGIN; idem_begin; (handler); idem_finalize;
-- COMMIT -- one commit per request.  The finalize is strict, as a handler
-- whose writes must roll back with a lost claim would call it.
\set r random(1, 9223372036854775806)
BEGIN;
SELECT * FROM idem_begin(sha256(int8send(:r)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '30 seconds') \gset
SELECT idem_finalize(sha256(int8send(:r)), :claim_id, 200, '{"content-type": "application/json"}'::jsonb, '{"id": 42, "status": "created"}'::bytea, true);
COMMIT;
