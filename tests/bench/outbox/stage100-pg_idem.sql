-- 100 events per transaction, one statement.
SELECT count(*) FROM idem_outbox_stage_batch('orders', array_fill('{"order_id": 123456789, "customer_id": 987654, "status": "created", "currency": "EUR", "amount_cents": 129900, "items": [{"sku": "SKU-000123", "qty": 2}, {"sku": "SKU-004567", "qty": 1}], "note": "leave at the door"}'::jsonb, ARRAY[100]));
