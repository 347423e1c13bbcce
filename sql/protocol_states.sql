-- The states of pg_idem's rows as the catalog has them, against protocol.toml:
-- every state a CHECK constraint, a partial index, a column default or a
-- trigger's condition compares a state column with is one of the protocol's,
-- and every CHECK that lists a column's states lists all of them.
-- Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
CREATE TEMP TABLE protocol_states (tbl name, col name, state text);
INSERT INTO protocol_states VALUES
    ('idem_keys', 'state', 'pending'),
    ('idem_keys', 'state', 'completed'),
    ('idem_keys', 'state', 'failed'),
    ('idem_keys', 'state', 'expired'),
    ('idem_outbox_queue', 'state', 'pending'),
    ('idem_outbox_queue', 'state', 'dead'),
    ('idem_outbox_queue', 'state', 'published'),
    ('idem_outbox_claimed', 'state', 'pending'),
    ('idem_outbox_claimed', 'state', 'dead'),
    ('idem_outbox_claimed', 'state', 'published'),
    ('idem_attempts', 'status', 'pending'),
    ('idem_attempts', 'status', 'stored'),
    ('idem_attempts', 'status', 'promoted'),
    ('idem_attempts', 'status', 'superseded'),
    ('idem_attempts', 'status', 'failed'),
    ('idem_attempts', 'failure_reason', 'reaped_no_blob'),
    ('idem_attempts', 'failure_reason', 'digest_mismatch'),
    ('idem_attempts', 'failure_reason', 'target_gone');
CREATE TEMP TABLE protocol_checks (tbl name, col name, conname name);
INSERT INTO protocol_checks VALUES
    ('idem_keys', 'state', 'idem_keys_state'),
    ('idem_attempts', 'status', 'idem_attempts_status'),
    ('idem_attempts', 'failure_reason', 'idem_attempts_failure_reason');
-- Every expression of the tables that can name a state, deparsed (a
-- column default as "column = default").
CREATE TEMP VIEW catalog_exprs AS
SELECT c.relname AS tbl, pg_get_constraintdef(k.oid) AS expr, k.conname AS conname
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
 WHERE k.contype = 'c' AND c.relname IN (SELECT tbl FROM protocol_states)
UNION ALL
SELECT c.relname, pg_get_expr(i.indpred, i.indrelid), NULL
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE i.indpred IS NOT NULL AND c.relname IN (SELECT tbl FROM protocol_states)
UNION ALL
SELECT c.relname, a.attname || ' = ' || pg_get_expr(d.adbin, d.adrelid), NULL
  FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid
  JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
 WHERE c.relname IN (SELECT tbl FROM protocol_states)
UNION ALL
SELECT c.relname, pg_get_triggerdef(t.oid), NULL
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE NOT t.tgisinternal AND c.relname IN (SELECT tbl FROM protocol_states);
-- (table, column, state, constraint) for every literal compared with a
-- state column: col = 'x', col <> 'x', col = ANY (ARRAY['x', ...]).
CREATE TEMP VIEW catalog_states AS
SELECT DISTINCT e.tbl, m[1] AS col, l[1] AS state, e.conname
  FROM catalog_exprs e
 CROSS JOIN LATERAL regexp_matches(e.expr,
       '(\w+)\s*(?:=|<>)\s*((?:ANY|ALL)\s*\(ARRAY\[[^]]*\]|''[a-z_]+'')', 'g') m
 CROSS JOIN LATERAL regexp_matches(m[2], '''([a-z_]+)''', 'g') l
 WHERE (e.tbl, m[1]) IN (SELECT tbl, col FROM protocol_states);
-- Named by the catalog, unknown to the protocol: none.
SELECT tbl, col, state FROM catalog_states
EXCEPT SELECT tbl, col, state FROM protocol_states ORDER BY 1, 2, 3;
-- Known to the protocol, missing from a CHECK that lists the column's
-- states: none.
SELECT s.tbl, c.conname, s.state FROM protocol_states s JOIN protocol_checks c USING (tbl, col)
EXCEPT SELECT tbl, conname, state FROM catalog_states ORDER BY 1, 2, 3;
-- The queries see what they check: every state column is compared with
-- states somewhere, and every listed CHECK names states.
SELECT p.tbl, p.col, count(DISTINCT c.state) > 0 AS compared
  FROM (SELECT DISTINCT tbl, col FROM protocol_states) p
  LEFT JOIN catalog_states c USING (tbl, col)
 GROUP BY 1, 2 ORDER BY 1, 2;
SELECT c.conname, EXISTS (SELECT FROM catalog_states s WHERE s.conname = c.conname) AS lists_states
  FROM protocol_checks c ORDER BY 1;
