-- floor, one hot completed key: a bare primary-key SELECT of the row pg_idem
-- replays, by every client.
SELECT state, request_hash, replayable, response_status, response_headers, response_body
  FROM idem_keys WHERE cache_key = sha256(int8send(1::bigint));
