-- Pins a fix from the review of the direct path (keys/evict.c): idem_evict now tombstones one row of
-- the key per call (KEY_MATCH_LIVE, the first in index order), so an
-- operator who evicts a key whose response must not be replayed leaves
-- every other scope's row, and the shared pre-0.3.0 row, replaying it.
-- 0.3.0's UPDATE ... WHERE cache_key = $1 tombstoned every row of the key.

CREATE ROLE regress_evict_role_a LOGIN;
CREATE ROLE regress_evict_role_b LOGIN;
GRANT idem_client TO regress_evict_role_a, regress_evict_role_b;

SET ROLE regress_evict_role_a;
SELECT claim_id AS ca FROM idem_claim(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), idem_request_hash('x')) \gset
SELECT idem_finalize(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), :'ca', 200, NULL, 'bad'::bytea) AS finalized;
SET ROLE regress_evict_role_b;
SELECT claim_id AS cb FROM idem_claim(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), idem_request_hash('x')) \gset
SELECT idem_finalize(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), :'cb', 200, NULL, 'bad'::bytea) AS finalized;
RESET ROLE;

SELECT idem_evict(idem_key('evict_every_scope', 'POST', '/evict', 'k1')) IS NOT NULL AS evict_called;
SELECT count(*) FILTER (WHERE state = 'completed') AS rows_still_replaying
  FROM idem_keys WHERE cache_key = idem_key('evict_every_scope', 'POST', '/evict', 'k1');
SET ROLE regress_evict_role_b;
SELECT outcome FROM idem_claim(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), idem_request_hash('x'));
SET ROLE regress_evict_role_a;
SELECT outcome FROM idem_claim(idem_key('evict_every_scope', 'POST', '/evict', 'k1'), idem_request_hash('x'));
RESET ROLE;

DELETE FROM idem_keys WHERE cache_key = idem_key('evict_every_scope', 'POST', '/evict', 'k1');
DROP ROLE regress_evict_role_a;
DROP ROLE regress_evict_role_b;
