-- One drainer iteration at batch :batch: claim (its own transaction),
-- publish (nothing here), ack (another transaction).
SELECT count(*) > 0 AS got, (array_agg(claim_token))[1] AS token, array_agg(id) AS ids
  FROM idem_outbox_claim(:batch, '30 s') \gset
\if :got
SELECT idem_outbox_ack(:token, :ids);
\endif
