-- pg_idem from psql: claim -> work -> finalize, a replay and a mismatch.
-- Run: psql -v ON_ERROR_STOP=1 -f payments.sql   (in a database with pg_idem)
\set ON_ERROR_STOP 1
CREATE TABLE IF NOT EXISTS example_payments (id bigserial PRIMARY KEY, amount int NOT NULL);

-- The key: principal, method, target and the Idempotency-Key header.
SELECT idem_key('bob', 'POST', '/payments', 'psql-order-1') AS cache_key,
       idem_request_hash(convert_to('{"amount": 250}', 'UTF8')) AS request_hash \gset

-- 1. Claim (committed on its own: followers now see in_progress).
SELECT outcome, claim_id, generation FROM idem_claim(:'cache_key', :'request_hash') \gset
\echo first claim: :outcome

-- 2. The handler's writes and the fenced finalize commit together.
BEGIN;
INSERT INTO example_payments (amount) VALUES (250) RETURNING id AS payment_id \gset
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
       AND (SELECT count(*) FROM example_payments) = 1 AS all_as_expected \gset
\if :all_as_expected
\echo psql example: ok
\else
\echo psql example: FAILED
\quit 1
\endif
