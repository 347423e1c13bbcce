-- Pins a fix from the second review of the direct path (table/direct_table.c direct_update): the direct update skips the
-- executor's CheckValidResultRel/CheckCmdReplicaIdentity.  With idem_keys
-- in a publication that publishes updates and REPLICA IDENTITY NOTHING
-- (or a row filter over columns outside the replica identity), 0.3.0's
-- UPDATE was refused; the direct update writes a change the publication
-- cannot describe (the subscriber cannot apply it).
-- Expected: idem_renew is refused as the UPDATE below is.

SET client_min_messages = error;
CREATE PUBLICATION regress_keys_publication FOR TABLE idem_keys;
RESET client_min_messages;
ALTER TABLE idem_keys REPLICA IDENTITY NOTHING;

SELECT claim_id AS c FROM idem_claim(idem_key('replica_identity', 'POST', '/ri', 'k1'), idem_request_hash('x')) \gset
SELECT idem_renew(idem_key('replica_identity', 'POST', '/ri', 'k1'), :'c', '1 min') IS NOT NULL AS renewed;
UPDATE idem_keys SET lease_expires_at = lease_expires_at
 WHERE cache_key = idem_key('replica_identity', 'POST', '/ri', 'k1');

ALTER TABLE idem_keys REPLICA IDENTITY DEFAULT;
DROP PUBLICATION regress_keys_publication;
DELETE FROM idem_keys WHERE cache_key = idem_key('replica_identity', 'POST', '/ri', 'k1');
