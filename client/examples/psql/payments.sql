-- pg_idem from psql: claim -> work -> finalize, a replay and a mismatch.
--
-- Run as the application role (GRANT idem_client), in a database with
-- pg_idem and this table, created once by its owner:
--   CREATE TABLE example_payments (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
--   GRANT SELECT, INSERT ON example_payments TO my_service_role;
--   GRANT USAGE ON SEQUENCE example_payments_id_seq TO my_service_role;
--
--   psql -X -v ON_ERROR_STOP=1 -f payments.sql
--
-- Exits non-zero (3, psql's code for a failed statement) when pg_idem does
-- not answer as documented.  run-example.sh also runs it with a wrong
-- expectation (-v expected_rows=2) to show that it can fail.
\set ON_ERROR_STOP 1
\if :{?expected_rows}
\else
\set expected_rows 1
\endif

-- The key: principal, method, target and the Idempotency-Key header (one
-- per run, so that the example can run again in the same database).
SELECT 'psql-order-' || gen_random_uuid() AS idempotency_key \gset
SELECT idem_key(current_user, 'POST', '/payments', :'idempotency_key') AS cache_key,
       idem_request_hash(convert_to('{"amount": 250}', 'UTF8')) AS request_hash \gset

-- 1. Claim (committed on its own: followers now see in_progress).
SELECT outcome, claim_id, generation FROM idem_claim(:'cache_key', :'request_hash') \gset
\echo first claim: :outcome

-- 2. The handler's writes and the fenced finalize commit together.
BEGIN;
INSERT INTO example_payments (key, amount) VALUES (:'idempotency_key', 250)
    RETURNING id AS payment_id \gset
SELECT idem_finalize(:'cache_key', :'claim_id', 201, '{"content-type": "application/json"}',
                     convert_to(format('{"payment": %s}', :payment_id), 'UTF8'),
                     strict => true) AS finalized \gset
COMMIT;
\echo finalized: :finalized

-- 3. A retry of the same request replays the stored response.
SELECT outcome AS retry_outcome, response_status,
       convert_from(response_body, 'UTF8') AS replayed_body
  FROM idem_claim(:'cache_key', :'request_hash') \gset
\echo retry: :retry_outcome :response_status :replayed_body

-- 4. The same key with another body is refused, and nothing is written.
SELECT outcome AS other_outcome
  FROM idem_claim(:'cache_key', idem_request_hash(convert_to('{"amount": 999}', 'UTF8'))) \gset
\echo another body: :other_outcome

-- Check what a reader of this example expects.
SELECT :'outcome' = 'claimed' AND :'finalized' = 't' AND :'retry_outcome' = 'replay'
       AND :response_status = 201 AND :'other_outcome' = 'mismatch'
       AND (SELECT count(*) FROM example_payments WHERE key = :'idempotency_key') = :expected_rows
       AS all_as_expected \gset
\if :all_as_expected
\echo psql example: ok
\else
\echo psql example: FAILED
-- psql ignores an argument to \quit: a failing statement under
-- ON_ERROR_STOP is what makes it exit non-zero.
DO $$ BEGIN RAISE EXCEPTION 'psql example: a result differs from the documented one'; END $$;
\endif
