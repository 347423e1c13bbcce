#!/usr/bin/env python3
"""make bench's SQL edition page (issue 32): the SQL edition against the C
edition and plain PL/pgSQL, from the CSVs of the same run.

    python3 tests/bench/sql_edition_report.py RESULTS MACHINE [CONNECT]

Reads RESULTS/raw/cells.csv and statements.csv (tests/bench/report.py: the
claim cycle and the replay, where run.sh ran the SQL edition's variant in
a database of its own on the same cluster, interleaved with the others)
and RESULTS/raw/outbox.csv (tests/bench/outbox.sh); writes
RESULTS/sql_edition.md, and the rows it used to RESULTS/raw/sql_edition.csv
(the page stands on its own: a later run of one section may rewrite the
other pages).  MACHINE is run.sh's machine.txt (date, mode, commit, load); CONNECT its
connect.csv (server CPU of one claim cycle on a kept connection and on a
new connection per request, in each edition).
Every number on the page is this run's: where a variant did not run, its
cells read "-".
"""

import csv
import os
import re
import statistics
import sys
from collections import defaultdict

RESULTS, MACHINE = sys.argv[1], sys.argv[2]
CONNECT = sys.argv[3] if len(sys.argv) > 3 else ""
RAW = os.path.join(RESULTS, "raw")
C, SQL, PLPGSQL = "pg_idem", "sql_edition", "plpgsql"
CLAIM_CELLS = [("cycle", c, s) for s in ("on", "off") for c in (1, 4, 16)] + [("replay", 4, "on")]
OUTBOX_CELLS = [("stage1", "stage 1 per transaction"), ("stage100", "stage 100 per transaction"),
                ("drain1", "claim + ack 1"), ("drain100", "claim + ack 100"),
                ("mixed", "2 producers + 2 drainers")]


def rows(name):
    path = os.path.join(RAW, name)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


cells = {r["cell"]: r for r in rows("cells.csv")}
machine = {}
if os.path.exists(MACHINE):
    for line in open(MACHINE):
        k, _, v = line.rstrip("\n").partition("=")
        machine[k] = v
used = []      # (section, cell, variant, measure, value): raw/sql_edition.csv


def cell(scenario, variant, clients, sync, field):
    r = cells.get(f"{scenario}/{variant}/c{clients}/{sync}")
    return num(r[field]) if r else None


out = ["# The SQL edition against the C edition and PL/pgSQL", "",
       f"`make bench MODE={machine.get('mode', '?').split()[0]}` on {machine.get('date', '?')}, "
       f"commit {machine.get('commit', '?')}, {machine.get('nproc', '?')} cores (load "
       f"{machine.get('load_start', '?')} at the start: shared with other work, so read the "
       "ratios, not the absolute numbers). Written by `tests/bench/sql_edition_report.py`: do "
       "not edit by hand; its numbers are in `raw/sql_edition.csv`. "
       "The SQL edition (`extension/sql_edition/`, installed with the plain script into a "
       "database of its own on the benchmark's cluster) answers the very pgbench scripts "
       "the C edition's cells run, interleaved with them round by round; **PL/pgSQL** is "
       "`tests/bench/sql/setup.sql`'s hand-written protocol on a table shaped like "
       "`idem_keys`. Throughput in requests (or events) per second, medians of the rounds; "
       "server CPU per request is the backends' CPU time over the cell, as the postmaster "
       "accounts its exited children, divided by the requests.", ""]

out += ["## Claim cycle and replay", "",
        "| cell | C edition | SQL edition | PL/pgSQL | SQL / C | SQL / PL/pgSQL "
        "| CPU µs: C | SQL | PL/pgSQL |", "|---|---|---|---|---|---|---|---|---|"]
claim_ratios, cpu_extra, plpgsql_ratios = [], [], []
for scenario, clients, sync in CLAIM_CELLS:
    tps = {v: cell(scenario, v, clients, sync, "tps") for v in (C, SQL, PLPGSQL)}
    cpu = {v: cell(scenario, v, clients, sync, "cpu_us_op") for v in (C, SQL, PLPGSQL)}
    if tps[SQL] is None:
        continue
    used.extend(("claims", f"{scenario}/c{clients}/{sync}", v, m, x)
                for m, d in (("tps", tps), ("cpu_us_op", cpu)) for v, x in d.items())
    r = ratio(tps[SQL], tps[C])
    if r is not None:
        claim_ratios.append((f"{scenario} c{clients}/{sync}", r))
    if ratio(tps[SQL], tps[PLPGSQL]) is not None:
        plpgsql_ratios.append(ratio(tps[SQL], tps[PLPGSQL]))
    if cpu[SQL] is not None and cpu[C] is not None:
        cpu_extra.append(cpu[SQL] - cpu[C])
    title = ("new-key cycle" if scenario == "cycle" else "replay") + \
        f", {clients} client{'s' if clients > 1 else ''}, synchronous_commit {sync}"
    out.append("| " + " | ".join([title, fmt(tps[C], ".0f"), fmt(tps[SQL], ".0f"),
                                  fmt(tps[PLPGSQL], ".0f"), fmt(r), fmt(ratio(tps[SQL], tps[PLPGSQL])),
                                  fmt(cpu[C], ".0f"), fmt(cpu[SQL], ".0f"),
                                  fmt(cpu[PLPGSQL], ".0f")]) + " |")
out.append("")

# Where the time goes: the statements of one request, one client, no
# commit flush (pgbench -r's per-statement latency): the same script text
# in both editions' cells.
stmts = defaultdict(dict)
for r in rows("statements.csv"):
    stmts[r["cell"]][r["statement"]] = num(r["median_ms"])
probe_c, probe_sql = stmts.get("cycle/pg_idem/c1/off", {}), stmts.get("cycle/sql_edition/c1/off", {})
common = [t for t in probe_c if t in probe_sql]
out += ["## Where the time goes", ""]
if claim_ratios:
    lo, hi = min(r for _, r in claim_ratios), max(r for _, r in claim_ratios)
    out.append(f"The SQL edition runs the claim cells at {lo:.2f} .. {hi:.2f} × the C edition's "
               "throughput in this run.")
if cpu_extra:
    out.append(f"Its extra server CPU per request is {statistics.median(cpu_extra):.0f} µs "
               f"(median over the cells; {min(cpu_extra):.0f} .. {max(cpu_extra):.0f}): what "
               "the C edition does with one executor call per row, the SQL edition does as "
               "PL/pgSQL statements, each a planned query run through SPI, with its own "
               "subtransaction around a fenced write (docs/guides/managed-postgresql.md). "
               "Where the cell waits on the disk (synchronous_commit on) the flush hides "
               "part of it; the cells without flushes show it whole.")
if plpgsql_ratios:
    out.append(f"Against the hand-written PL/pgSQL it runs at {min(plpgsql_ratios):.2f} .. "
               f"{max(plpgsql_ratios):.2f} ×. That PL/pgSQL (`bench.plpgsql_claim`) is the "
               "decision alone: the scope is the column's default, one setting is read, and "
               "there is no argument check, no second horizon, no subtransaction for a "
               "fenced write and no statistics; "
               "the SQL edition does each of those as the C edition does (the same tests). "
               "Which of them costs what is not separated in this run.")
if common:
    out += ["", "Per statement, one client without commit flushes (pgbench `-r`, median ms):", "",
            "| statement | C edition | SQL edition | SQL − C |", "|---|---|---|---|"]
    for t in common:
        a, b = probe_c[t], probe_sql[t]
        used.extend(("statements", t, v, "median_ms", x) for v, x in ((C, a), (SQL, b)))
        out.append(f"| `{t[:70]}` | {fmt(a, '.3f')} | {fmt(b, '.3f')} | "
                   f"{fmt(b - a if a is not None and b is not None else None, '.3f')} |")
out.append("")

# A new connection's cost: one claim cycle per connection against many on
# one kept connection, both editions (run.sh's connect probe).
connect = {}
if CONNECT and os.path.exists(CONNECT):
    with open(CONNECT, newline="") as f:
        for r in csv.DictReader(f):
            n, cpu_s = num(r["requests"]), num(r["cpu_seconds"])
            if n and cpu_s is not None:
                connect[(r["variant"], r["connection"])] = cpu_s * 1e6 / n
if all((v, h) in connect for v in (C, SQL) for h in ("kept", "new")):
    out += ["### A new connection's first request", "",
            "Server CPU per claim cycle (claim and finalize, no commit flush), one client: on "
            "one kept connection, and with a new connection for every request (pgbench `-C`). "
            "The difference is what a backend pays once: its start, and, in the SQL edition, "
            "compiling the PL/pgSQL functions and filling the caches at their first call.", "",
            "| edition | kept connection µs | new connection µs | once per connection µs |",
            "|---|---|---|---|"]
    for v, title in ((C, "C edition"), (SQL, "SQL edition")):
        kept, new = connect[(v, "kept")], connect[(v, "new")]
        used.extend(("connect", "cycle/c1/off", v, m, x)
                    for m, x in (("cpu_us_kept", kept), ("cpu_us_new", new)))
        out.append(f"| {title} | {kept:.0f} | {new:.0f} | {new - kept:.0f} |")
    secs = re.search(r"\bsecs=(\d+)", machine.get("mode", ""))
    extra = (connect[(SQL, "new")] - connect[(SQL, "kept")]) - (connect[(C, "new")] - connect[(C, "kept")])
    out += ["", f"A new backend costs the SQL edition {extra / 1000:.1f} ms of server CPU more "
            "than the C edition, once. The cells above open their clients' connections anew, "
            f"{secs.group(1) if secs else 'a few'} s each: with 16 clients that is 16 such "
            "first requests per cell on 2 cores, which is why the SQL edition's 16-client "
            "cells fall furthest in a short run. A pool that keeps its connections (every "
            "client's default) pays it once per connection.", ""]

# The outbox: events per second and CPU per event, from outbox.sh's rounds.
rates, cpus = defaultdict(list), defaultdict(list)
for r in rows("outbox.csv"):
    key = (r["cell"], r["variant"])
    rates[key].append(num(r["events_per_s"]))
    events, cpu_s = num(r["events"]), num(r["cpu_s"])
    if events and cpu_s is not None:
        cpus[key].append(cpu_s * 1e6 / events)
med = {k: statistics.median(v) for k, v in rates.items() if v}
cpu_med = {k: statistics.median(v) for k, v in cpus.items() if v}
if any(k[1] == SQL for k in med):
    out += ["## Outbox", "",
            "Both with the archive on (the default); events per second and server CPU per event.",
            "", "| cell | C edition | SQL edition | SQL / C | CPU µs: C | SQL |",
            "|---|---|---|---|---|---|"]
    for c, title in OUTBOX_CELLS:
        a, b = med.get((c, C)), med.get((c, SQL))
        if b is None:
            continue
        used.extend(("outbox", c, v, m, x) for v in (C, SQL)
                    for m, x in (("events_per_s", med.get((c, v))), ("cpu_us_event", cpu_med.get((c, v)))))
        out.append(f"| {title} | {fmt(a, '.0f')} | {fmt(b, '.0f')} | {fmt(ratio(b, a))} | "
                   f"{fmt(cpu_med.get((c, C)), '.1f')} | {fmt(cpu_med.get((c, SQL)), '.1f')} |")
    out.append("")
else:
    out += ["## Outbox", "", "Not measured in this run (tests/bench/outbox.sh did not run the "
            "SQL edition's variant).", ""]

os.makedirs(RAW, exist_ok=True)
with open(os.path.join(RAW, "sql_edition.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["section", "cell", "variant", "measure", "value"])
    w.writerows((s_, c_, v_, m_, "" if x_ is None else round(x_, 4)) for s_, c_, v_, m_, x_ in used)
with open(os.path.join(RESULTS, "sql_edition.md"), "w") as f:
    f.write("\n".join(out))
print(f"SQL edition results: {os.path.join(RESULTS, 'sql_edition.md')}")
