-- Pins a fix from the review of the direct path (keys/key_table.c): key_table_insert builds the new row
-- from the protocol's columns and NULL for every other column
-- (slot_from_row: memset(nulls, true)); column defaults (and stored
-- generated columns) are not evaluated.  A column an operator adds with a
-- default gets NULL, and with NOT NULL DEFAULT every new-key claim fails
-- with a not-null violation.  0.3.0's INSERT named its columns and let
-- the others take their defaults.

BEGIN;
ALTER TABLE idem_keys ADD COLUMN operator_note text NOT NULL DEFAULT 'n/a';
SELECT outcome FROM idem_claim(idem_key('column_defaults', 'POST', '/default', 'k1'), idem_request_hash('x'));
SELECT operator_note FROM idem_keys WHERE cache_key = idem_key('column_defaults', 'POST', '/default', 'k1');
ROLLBACK;

BEGIN;
ALTER TABLE idem_keys ADD COLUMN operator_note text DEFAULT 'n/a';
SELECT outcome FROM idem_claim(idem_key('column_defaults', 'POST', '/default', 'k2'), idem_request_hash('x'));
SELECT operator_note FROM idem_keys WHERE cache_key = idem_key('column_defaults', 'POST', '/default', 'k2');
ROLLBACK;

-- the kept state follows the rollback
SELECT outcome FROM idem_claim(idem_key('column_defaults', 'POST', '/default', 'k3'), idem_request_hash('x'));
DELETE FROM idem_keys WHERE cache_key = idem_key('column_defaults', 'POST', '/default', 'k3');
