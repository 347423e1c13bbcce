-- floor, replay: a bare primary-key SELECT of the same completed row of
-- idem_keys that pg_idem replays (the columns a replay needs).
\set k random(1, 10000)
SELECT state, request_hash, replayable, response_status, response_headers, response_body
  FROM idem_keys WHERE cache_key = sha256(int8send(:k));
