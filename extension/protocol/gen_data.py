"""What the tests read: the clients' conformance data and the server's
regression tests of the key vectors and the row states."""

import json

import limits
import messaging
from model import NOTE, attempt_states, cache_key, classify_status, namespaced, row_tables, table_states


def gen_conformance(p):
    """What every client must answer for every server outcome, per profile."""
    profiles = p["problems"]["profiles"]
    problems = {x["name"]: x for x in p["problem"]}
    cases = []
    for o in p["outcome"]:
        for pr in profiles:
            case = {"outcome": o["name"], "profile": pr, "action": o["client"]}
            if o.get("problem"):
                x = problems[o["problem"]]
                case["status"] = x["status"][pr]
                case["type"] = p["problems"]["base"] + x["slug"]
                case["retry_after"] = x["retry_after"]
            if o.get("result"):
                case["result"] = o["result"]
            cases.append(case)
    storage = []
    for s in (100, 101, 200, 201, 204, 299, 301, 304, 400, 401, 403, 404, 405, 408, 409, 410,
              422, 429, 499, 500, 502, 503, 599, 600, 0, -1):
        storage.append({"status": s, "action": classify_status(p, s)})
    doc = {
        "note": NOTE,
        "outcomes": cases,
        "storage": storage,
        "key_vectors": [{k: v[k] for k in ("principal", "method", "target", "key", "cache_key")}
                        for v in p["key_vector"]],
        "request_hash_vectors": p["request_hash_vector"],
        "key_statuses": {k["name"]: k["description"] for k in p["key_status"]},
        "client": {"oldest_extension": p["client"]["oldest_extension"],
                   "validation_statuses": p["client"]["validation_statuses"],
                   "defaults": p["client"]["defaults"],
                   "limits": p["client"]["limits"]},
        "profiles": p["problems"]["profiles"],
        "deprecated_profiles": p["problems"].get("deprecated_profiles", {}),
        "namespace_vectors": namespace_vectors(p),
        "replay_headers": replay_header_vectors(p),
        "events": [e["name"] for e in p["event"]],
        "metrics": {k: p["metrics"][k] for k in ("requests", "events")},
        **limits.conformance(p),
        "messaging": messaging.conformance(p),
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def sql_literal(s):
    return "'" + s.replace("'", "''") + "'"


def gen_sql_vectors(p):
    L = ["-- The server's idem_key() and idem_request_hash() against the protocol's test",
         "-- vectors (the clients' suites check the same ones).",
         "-- " + NOTE,
         "SELECT left(v.key, 40) AS key, encode(idem_key(v.principal, v.method, v.target, v.key), 'hex') = v.cache_key AS same",
         "  FROM (VALUES"]
    rows = []
    for v in p["key_vector"]:
        rows.append("    (%s, %s, %s, %s, %s)" % tuple(sql_literal(v[k]) for k in (
            "principal", "method", "target", "key", "cache_key")))
    L.append(",\n".join(rows))
    L += ["  ) AS v(principal, method, target, key, cache_key)", " ORDER BY 1;",
          "SELECT v.body, encode(idem_request_hash(convert_to(v.body, 'UTF8')), 'hex') = v.request_hash AS same",
          "  FROM (VALUES"]
    rows = ["    (%s, %s)" % (sql_literal(v["body"]), sql_literal(v["request_hash"])) for v in p["request_hash_vector"]]
    L.append(",\n".join(rows))
    L += ["  ) AS v(body, request_hash)", " ORDER BY 1;", ""]
    return "\n".join(L)


def namespace_vectors(p):
    """Keys a namespace makes, for each client's own namespace setting."""
    out = []
    for ns, v in (("payments", p["key_vector"][0]), ("billing", p["key_vector"][0]),
                  ("tenant-7.api", p["key_vector"][2]), (None, p["key_vector"][0])):
        target = namespaced(p, ns, v["target"])
        row = {"namespace": ns, "principal": v["principal"], "method": v["method"], "target": v["target"],
               "key": v["key"], "namespaced_target": target}
        row["cache_key"] = cache_key(p, dict(row, target=target))
        out.append(row)
    return out


def replay_header_vectors(p):
    """The replay headers, and names with whether each client stores them:
    by default, and when a configuration asks for them."""
    rh = p["replay_headers"]
    names = []
    for n in rh["default"]:
        names += [(n, True, True), (n.upper(), True, True)]
    for n in rh["never_stored"]:
        names += [(n, False, False), (n.title(), False, False)]
    for part in rh["never_stored_parts"]:
        names.append(("x-%s-id" % part, False, False))
    for n in ("x-request-id", "retry-after", "x-trace"):
        names.append((n, False, True))
    return {"replayed_header": rh["replayed_header"], "default": rh["default"],
            "never_stored": rh["never_stored"], "never_stored_parts": rh["never_stored_parts"],
            "vectors": [{"name": n, "by_default": a, "when_configured": b} for n, a, b in names]}


STATES_QUERIES = r"""-- Every expression of the tables that can name a state, deparsed (a
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
"""


def gen_sql_states(p):
    """A regression test: the states the catalog's CHECK constraints,
    partial indexes, column defaults and trigger conditions name are the
    protocol's ([[row_states]] and the attempts' transitions)."""
    statuses, reasons = attempt_states(p)
    rows = [(t, "state", x) for r in p["row_states"] for t in row_tables(r)
            for x in table_states(p, r["name"])]
    rows += [("idem_attempts", "status", x) for x in statuses]
    rows += [("idem_attempts", "failure_reason", x) for x in reasons]
    checks = [(row_tables(r)[0], "state", r["check"]) for r in p["row_states"] if r.get("check")]
    checks += [("idem_attempts", "status", "idem_attempts_status"),
               ("idem_attempts", "failure_reason", "idem_attempts_failure_reason")]
    L = ["-- The states of pg_idem's rows as the catalog has them, against protocol.toml:",
         "-- every state a CHECK constraint, a partial index, a column default or a",
         "-- trigger's condition compares a state column with is one of the protocol's,",
         "-- and every CHECK that lists a column's states lists all of them.",
         "-- " + NOTE,
         "CREATE TEMP TABLE protocol_states (tbl name, col name, state text);",
         "INSERT INTO protocol_states VALUES",
         ",\n".join("    (%s, %s, %s)" % (sql_literal(t), sql_literal(c), sql_literal(x)) for t, c, x in rows) + ";",
         "CREATE TEMP TABLE protocol_checks (tbl name, col name, conname name);",
         "INSERT INTO protocol_checks VALUES",
         ",\n".join("    (%s, %s, %s)" % tuple(sql_literal(v) for v in c) for c in checks) + ";"]
    return "\n".join(L) + "\n" + STATES_QUERIES
