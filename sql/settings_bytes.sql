-- idem.max_response_bytes takes 0 .. 1GB, as the README says (issue 12,
-- defect 8: '1GB' used to be refused, the limit was 1 GB - 1 byte).
-- 1GB keeps every body: a bytea holds less than 1 GB.
SELECT min_val, max_val, unit, short_desc LIKE '%(0 .. 1GB%' AS described
  FROM pg_settings WHERE name = 'idem.max_response_bytes';
SET idem.max_response_bytes = '1GB';
SHOW idem.max_response_bytes;
SET idem.max_response_bytes = 1073741824;
SHOW idem.max_response_bytes;
-- One byte more is refused, with the range.
SET idem.max_response_bytes = 1073741825;
SET idem.max_response_bytes = '1025MB';
SHOW idem.max_response_bytes;
-- (The SQL edition keeps a bad value until it is used: 1GB again.)
SET idem.max_response_bytes = '1GB';

-- Under 1GB a body of a few megabytes (over the 2MB default) is replayed.
SELECT outcome FROM idem_claim(idem_key('settings-bytes', 'POST', '/big', 'k1'), sha256('big'));
SELECT idem_finalize(idem_key('settings-bytes', 'POST', '/big', 'k1'), claim_id, 200, NULL,
                     convert_to(repeat('x', 3 * 1024 * 1024), 'UTF8')) AS finalized
  FROM idem_keys WHERE cache_key = idem_key('settings-bytes', 'POST', '/big', 'k1');
SELECT outcome, octet_length(response_body) AS body_bytes
  FROM idem_claim(idem_key('settings-bytes', 'POST', '/big', 'k1'), sha256('big'));
RESET idem.max_response_bytes;
SELECT idem_evict(idem_key('settings-bytes', 'POST', '/big', 'k1')) AS evicted;
