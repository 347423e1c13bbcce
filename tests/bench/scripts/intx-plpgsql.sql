-- PL/pgSQL, one transaction per request: BEGIN; claim; (handler); finalize;
-- COMMIT.  The PL/pgSQL table has no in-transaction trigger, so nothing
-- checks at commit that the claim was finished.
\set r random(1, 9223372036854775806)
BEGIN;
SELECT * FROM bench.plpgsql_claim(sha256(int8send(:r)), '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea, interval '30 seconds') \gset
SELECT bench.plpgsql_finalize(sha256(int8send(:r)), :claim_id, 200, '{"content-type": "application/json"}'::jsonb, '{"id": 42, "status": "created"}'::bytea);
COMMIT;
