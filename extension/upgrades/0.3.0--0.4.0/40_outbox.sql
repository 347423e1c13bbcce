-- Staging (idem_outbox_stage, idem_outbox_stage_bytes, idem_outbox_stage_batch)
-- writes idem_outbox_queue directly too; the privileges piece makes those
-- functions SECURITY INVOKER.
COMMENT ON FUNCTION @extschema@.idem_outbox_stage_batch(pg_catalog.text, pg_catalog.jsonb[], pg_catalog.text[], pg_catalog.jsonb[], pg_catalog.interval) IS
    'stage one event per payload in one call, in array order; returns their ids in that order';
