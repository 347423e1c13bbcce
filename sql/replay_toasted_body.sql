-- Pins a review finding: a cached response stored out of line (TOAST) must be
-- replayed intact.  The result row of idem_claim, idem_begin and
-- idem_lookup holds the body; it must be flattened in the caller's memory,
-- not in SPI's, which is gone when the function returns (a backend that
-- had not touched large allocations before crashed with SIGSEGV).
--
-- The body is 1.28 MB of SHA-256 output: incompressible, so TOASTed
-- out of line.  Each replay runs in a fresh backend (\c).

CREATE TABLE review_big AS
SELECT string_agg(sha256(int4send(i)), ''::bytea ORDER BY i) AS body
  FROM generate_series(1, 40000) AS i;
SELECT octet_length(body) AS body_bytes FROM review_big;

SELECT claim_id AS cid FROM idem_claim(idem_key('review', 'POST', '/big', 'k1'), sha256('req'))
\gset
SELECT idem_finalize(idem_key('review', 'POST', '/big', 'k1'), :'cid', 200,
                     '{"content-type": "application/octet-stream"}',
                     (SELECT body FROM review_big)) AS finalized;

\c
SELECT outcome, response_status, octet_length(response_body) AS bytes,
       response_body = (SELECT body FROM review_big) AS intact
  FROM idem_claim(idem_key('review', 'POST', '/big', 'k1'), sha256('req'));

\c
SELECT outcome, octet_length(response_body) AS bytes,
       response_body = (SELECT body FROM review_big) AS intact
  FROM idem_lookup(idem_key('review', 'POST', '/big', 'k1'), sha256('req'));

\c
BEGIN;
SELECT outcome, octet_length(response_body) AS bytes,
       response_body = (SELECT body FROM review_big) AS intact
  FROM idem_begin(idem_key('review', 'POST', '/big', 'k1'), sha256('req'));
COMMIT;

DELETE FROM idem_keys WHERE cache_key = idem_key('review', 'POST', '/big', 'k1');
DROP TABLE review_big;
