-- pg_idem outbox, drain: one drainer iteration at batch :batch (-D batch=N):
-- claim a batch (its own transaction, so the lease is visible), publish
-- (nothing here), ack the batch.
SELECT count(*) > 0 AS got, (array_agg(claim_token))[1] AS token, array_agg(id) AS ids
  FROM idem_outbox_claim(:batch) \gset
\if :got
SELECT idem_outbox_ack(:token, :ids);
\endif
