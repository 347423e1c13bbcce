-- The queue's pages keep room for the claim's rewrite of their events, so
-- that it stays on the page and logs only what changed (see
-- extension/install/40_outbox.sql).  Pages written before keep their
-- rows; new ones are filled to 40 %.
ALTER TABLE @extschema@.idem_outbox_queue SET (fillfactor = 40);
