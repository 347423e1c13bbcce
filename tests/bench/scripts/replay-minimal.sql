-- minimal floor, replay: a bare primary-key SELECT of the stored response
-- (the columns a replay needs) from bench.idem_minimal, seeded with the
-- same 10 000 completed rows as idem_keys.
\set k random(1, 10000)
SELECT state, request_hash, replayable, response_status, response_headers, response_body
  FROM bench.idem_minimal WHERE cache_key = sha256(int8send(:k));
