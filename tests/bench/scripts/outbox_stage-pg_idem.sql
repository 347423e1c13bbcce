-- pg_idem outbox, stage: one event per request, in a transaction of its own
-- (in an application, the handler's), with a message key for per-key order.
\set r random(1, 9223372036854775806)
SELECT idem_outbox_stage('orders', '{"id": 42, "status": "created"}'::jsonb, 'order-' || :r);
