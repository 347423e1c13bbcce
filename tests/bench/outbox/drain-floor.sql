-- pgmq's read (FOR UPDATE SKIP LOCKED, then a visibility time) and its
-- delete, as plain SQL on one table.
WITH cte AS (SELECT msg_id FROM floor.q WHERE vt <= clock_timestamp()
              ORDER BY msg_id LIMIT :batch FOR UPDATE SKIP LOCKED),
     upd AS (UPDATE floor.q m SET vt = clock_timestamp() + interval '30 s', read_ct = read_ct + 1
               FROM cte WHERE m.msg_id = cte.msg_id
             RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message)
SELECT count(*) > 0 AS got, array_agg(msg_id) AS ids FROM upd \gset
\if :got
DELETE FROM floor.q WHERE msg_id = ANY (:ids::bigint[]);
\endif
