SELECT count(*) > 0 AS got, array_agg(msg_id) AS ids FROM pgmq.read('bench', 30, :batch) \gset
\if :got
SELECT count(*) FROM pgmq.delete('bench', :ids::bigint[]);
\endif
