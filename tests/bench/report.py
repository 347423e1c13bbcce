#!/usr/bin/env python3
"""Turn one benchmark run's raw measurements into tests/bench/results/.

usage: report.py WORK RESULTS PLOTS

WORK is the runner's scratch directory (runs/NNNN/, steady/NAME/, info/);
RESULTS receives results.md, the PNG plots and raw/*.csv; PLOTS holds the
gnuplot scripts.  Prints the targets as a pass/fail table.  Everything the
page says about a missed target is computed from this run's measurements.
"""
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
# The run's measurements (report_runs.py), its targets (report_targets.py)
# and the explanation of the missed ones (report_why.py); outbox.md is
# outbox_report.py's, the causes that stand from run to run are why.py's.
import report_runs  # noqa: E402
import report_targets  # noqa: E402
import report_why  # noqa: E402
from report_runs import (CYCLE_POINTS, NAMES, VARIANTS, WINDOW, agg, cell, cells,  # noqa: E402
                         cpu_ratio, fmt, get, median, ratio, read_kv, steady, waldumps)
from report_targets import (GAPS, HEADLINE, LABEL, client_cycle, targets,  # noqa: E402
                            verdicts, wakeup)

WORK, RESULTS, PLOTS = sys.argv[1:4]
RAW = os.path.join(RESULTS, "raw")
PLOTDATA = os.path.join(WORK, "plotdata")
os.makedirs(RAW, exist_ok=True)
os.makedirs(PLOTDATA, exist_ok=True)
# The outbox's CSVs, when tests/bench/outbox.sh ran in this run (before
# this report: run.sh passes them in WORK/outbox).
OUTBOX = os.path.join(WORK, "outbox")
# What outbox.sh and outbox_instructions.sh of this run wrote into raw/
# themselves, before this report: kept when the outbox ran in this run.
OUTBOX_WROTE = {"outbox_wal_records.csv", "outbox_machine.txt", "outbox_instructions.csv"} \
    if os.path.exists(os.path.join(OUTBOX, "outbox.csv")) else set()
# Everything below is this run's: no plot or CSV of an earlier run may stay.
# growth.sh's plots (growth_*.png) are written before this report, as raw/growth/.
for stale in [os.path.join(RESULTS, f) for f in os.listdir(RESULTS)
              if f.endswith(".png") and not f.startswith("growth_")] + \
        [os.path.join(RAW, f) for f in os.listdir(RAW) if f not in OUTBOX_WROTE]:
    if os.path.isfile(stale):    # raw/growth/ is growth.sh's, written before this report
        os.remove(stale)
if os.path.exists(os.path.join(OUTBOX, "outbox.csv")):
    shutil.copy(os.path.join(OUTBOX, "outbox.csv"), os.path.join(RAW, "outbox.csv"))
    shutil.copy(os.path.join(OUTBOX, "life.csv"), os.path.join(RAW, "outbox_life.csv"))

report_runs.load(WORK, RAW, PLOTDATA)
runs_dir = os.path.join(WORK, "runs")
ISSUE13_TARGETS, outbox_cost = report_targets.judge(WORK, OUTBOX, os.path.join(WORK, "growth"))

# --------------------------------------------------------------------------
# Plot data and plots.
with open(os.path.join(PLOTDATA, "cycle.dat"), "w") as f:
    for sync in ("on", "off"):
        f.write(f"# synchronous_commit {sync}: clients, then per variant tps min max p50 p99\n")
        for c in (1, 4, 16):
            row = [str(c)]
            for v in VARIANTS:
                a = cell("cycle", v, c, sync) or {}
                row += [fmt(a.get("tps"), ".1f"), fmt(a.get("tps_min"), ".1f"),
                        fmt(a.get("tps_max"), ".1f"), fmt(a.get("p50_ms"), ".3f"),
                        fmt(a.get("p99_ms"), ".3f")]
            f.write(" ".join(row) + "\n")
        f.write("\n\n")
SCEN = [("cycle 1c", "cycle", 1), ("cycle 4c", "cycle", 4), ("cycle 16c", "cycle", 16),
        ("in-txn 1c", "intx", 1), ("in-txn 16c", "intx", 16), ("replay", "replay", 4),
        ("hot 64", "hot64", 16), ("hot 1", "hot1", 16), ("renew", "renew", 4)]
HEADER = "scenario " + " ".join(f'"{NAMES[v]}"' for v in VARIANTS) + "\n"
# Relative to the minimal floor, issue 13's base.
with open(os.path.join(PLOTDATA, "scenarios.dat"), "w") as f:
    f.write(HEADER)
    for label, sc, c in SCEN:
        floor = cell(sc, "minimal", c)
        f.write(f'"{label}" ' + " ".join(fmt(ratio(cell(sc, v, c), floor), ".3f").replace("-", "NaN")
                                       for v in VARIANTS) + "\n")
with open(os.path.join(PLOTDATA, "scenarios_cpu.dat"), "w") as f:
    f.write(HEADER)
    for label, sc, c in SCEN:
        floor = cell(sc, "minimal", c)
        f.write(f'"{label}" ' + " ".join(fmt(ratio(floor, cell(sc, v, c), "cpu_us_op"), ".3f")
                                       .replace("-", "NaN") for v in VARIANTS) + "\n")
with open(os.path.join(PLOTDATA, "wal.dat"), "w") as f:
    f.write(HEADER)
    for label, sc, c in SCEN:
        if sc != "replay":
            f.write(f'"{label}" ' + " ".join(fmt(get(sc, v, c, "wal_bytes_op"), ".1f")
                                           .replace("-", "NaN") for v in VARIANTS) + "\n")

plots = set()
for script in sorted(os.listdir(PLOTS)):
    if not script.endswith(".gp"):
        continue
    base = script[:-3]
    jobs = ([(f"steady_{n}", f"data='{PLOTDATA}/steady_{n}.dat'; name='{n}'; "
              f"phase={steady[n]['meta'].get('phase', 0)}") for n in steady]
            if base == "steady" else [(base, f"datadir='{PLOTDATA}'")])
    if base == "steady":
        jobs = [(png, args + f"; warmup={steady[png[7:]]['meta'].get('warmup', 0)}")
                for png, args in jobs]
    for png, args in jobs:
        out = os.path.join(RESULTS, png + ".png")
        if subprocess.run(["gnuplot", "-e", f"{args}; out='{out}'",
                           os.path.join(PLOTS, script)]).returncode == 0:
            plots.add(png + ".png")

# --------------------------------------------------------------------------
# The results page.
machine = read_kv(os.path.join(WORK, "info", "machine.txt"))
fsync_text = open(os.path.join(WORK, "info", "pg_test_fsync.txt")).read()
fsync_rates = {}   # the first section: one 8 kB write per flush
for m in re.finditer(r"^\s+(open_datasync|fdatasync|fsync)\s+([\d.]+) ops/sec\s+(\d+) usecs/op",
                     fsync_text, re.M):
    fsync_rates.setdefault(m.group(1), (float(m.group(2)), int(m.group(3))))
for name in ("pg_test_fsync.txt", "settings.tsv"):
    with open(os.path.join(RAW, name), "w") as f:
        f.write(open(os.path.join(WORK, "info", name)).read())
settings = [row for row in (line.rstrip("\n").split("\t") for line in
                            open(os.path.join(WORK, "info", "settings.tsv")) if line.strip())
            if row[-1] not in ("client", "environment variable")]
mode = machine.get("mode", "?")

md = []
P = md.append


def table(header, rows):
    P("| " + " | ".join(header) + " |")
    P("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        P("| " + " | ".join(str(x) for x in r) + " |")
    P("")


CELL_HEADER = ["variant", "clients", "sync commit", "tps", "spread", "p50 ms", "p99 ms",
               "CPU µs/req", "flush ms", "WAL B/req", "FPI/req", "WAL rec/req", "HOT %",
               "table+index KiB", "B/row", "failed"]


def cell_rows(keys):
    rows = []
    for k in keys:
        a = agg.get(k)
        if a:
            rows.append([NAMES[a["variant"]], a["clients"], a["sync"], fmt(a["tps"], ".0f"),
                         fmt(100 * a["spread"], ".0f") + " %" if a["spread"] is not None else "-",
                         fmt(a["p50_ms"], ".3f"), fmt(a["p99_ms"], ".3f"),
                         fmt(a["cpu_us_op"], ".0f"), fmt(a["flush_ms"], ".3f"),
                         fmt(a["wal_bytes_op"], ".0f"),
                         fmt(a["fpi_op"], ".3f"), fmt(a["wal_records_op"], ".2f"),
                         fmt(a["hot_pct"], ".1f"), fmt(a["size_bytes"] / 1024, ".0f"),
                         fmt(a["bytes_row"], ".0f"),
                         f"{a['failed']} ({a['errors']})" if a["errors"] else a["failed"]])
    table(CELL_HEADER, rows)


P("# pg_idem benchmark results")
P("")
P(f"`make bench MODE={mode}` on {machine.get('date')}, commit {machine.get('commit')}; "
  f"{machine.get('rounds')} rounds × {machine.get('secs')} s per cell; steady state with "
  f"`idem.ttl = {machine.get('steady_ttl')}`, a {machine.get('steady_warmup')} s warm-up and "
  f"phases of {machine.get('steady_phase')} s; wall time {machine.get('wall_seconds')} s" +
  (f", {machine['total_wall_seconds']} s with the outbox section"
   if machine.get("total_wall_seconds") else "") + ".")
P("")
P("Written by `tests/bench/run.sh` through `tests/bench/report.py`: do not edit by hand. "
  "Raw numbers in [raw/](raw/): `runs.csv` (one row per pgbench run, with `pg_stat_wal` "
  "and `pg_stat_user_tables` before and after), `cells.csv` (the medians below), "
  "`statements.csv` (per-statement latencies), `wal_records.csv` (`pg_waldump "
  "--stats=record` of each cell's first run), `steady_*.csv`, `settings.tsv` and "
  "`pg_test_fsync.txt`. Run it again with `make bench` (quick) or `make bench MODE=full`; "
  "`BENCH_KEEP=1` keeps the scratch directory (cluster, logs) for a look afterwards.")
P("")
P(f"**Noise.** {machine.get('nproc')} cores shared with other engineers' builds and tests "
  f"(load average {machine.get('load_start')} at the start, {machine.get('load_end')} at the "
  "end). *Spread* is (max − min) / median of a cell's rounds: a ratio closer to its target "
  "than the spreads of the two cells is not conclusive. *CPU µs/req* (server CPU per "
  "request, from the backends' own CPU time) is far less sensitive to the other load than "
  "throughput is, and is what the explanations below lean on." +
  (" Quick mode runs each cell for two one-second rounds (the median of two is their mean); "
   "quote `make bench MODE=full` numbers." if mode == "quick" else ""))
P("")
P("## Targets")
P("")
P(f"The first {ISSUE13_TARGETS} rows and the outbox rows are issue 13's (the fast path), "
  "with issue 35's bounds where it raised them (the cycle against PL/pgSQL 1.3 ×, the replay "
  "0.95 ×; the outbox's batch cells against pgmq with the archive on as well as off); "
  + ("the last row is issue 35's, from the growth section's pacing part ([growth.md](growth.md)); "
     if any(t[0].startswith("claim p99 during the worker's cleanup") for t in targets) else "") +
  "the others are kept from issue 5. The new-key cycle's verdicts are those of the headline "
  f"cell, {HEADLINE[0]} clients with `synchronous_commit = {HEADLINE[1]}` (the other cells "
  "are listed beside it); the outbox's are judged with `idem.outbox_archive = off`, as the "
  "floor keeps no published event ([outbox.md](outbox.md)).")
P("")
table(["target", "measured", "result"], targets)
if outbox_cost:
    P(outbox_cost)
    P("")

# --------------------------------------------------------------------------
# Why the missed targets were missed: every number from this run.
disagree = []
for key, (title, sc, base, c, s_, t, limit, kind) in GAPS.items():
    u = cpu_ratio(sc, "pg_idem", base, c, s_) if kind == "tps" else None
    if t is not None and u is not None and (t >= limit) != (u >= limit):
        disagree.append(f"{title}: {t:.2f} by throughput, {u:.2f} by CPU")
for base, limit in (("floor", 0.95), ("cte", 1.0)):
    for c, s_ in CYCLE_POINTS:
        t = ratio(cell("cycle", "pg_idem", c, s_), cell("cycle", base, c, s_))
        u = cpu_ratio("cycle", "pg_idem", base, c, s_)
        if t is not None and u is not None and (t >= limit) != (u >= limit):
            disagree.append(f"pg_idem / {NAMES[base]} at {c} client{'s' if c > 1 else ''}, "
                            f"sync {s_}: {t:.2f} by throughput, {u:.2f} by CPU")
wake_rounds = [r["advisory_lock"] / r["polling"] for r in client_cycle.values()
               if r.get("advisory_lock") and r.get("polling")]
if wake_rounds and min(wake_rounds) < 0.97 <= max(wake_rounds):
    disagree.append("the uncontended cycle with and without the wake-up: its rounds give "
                    f"{min(wake_rounds):.2f} to {max(wake_rounds):.2f}")
if disagree:
    P("**Verdicts the noise may have decided** (the throughput verdict and the CPU-based one "
      "disagree, or the rounds fall on both sides of the target): " + "; ".join(disagree) + ".")
    P("")

P("## Against the minimal floor and PL/pgSQL")
P("")
P("Issue 13's bases for every scenario: the **minimal floor** (the bare statements on a table "
  "with idem_keys' columns and primary key only: no CHECK constraints, no trigger, fillfactor "
  "70) and the same protocol as **PL/pgSQL** functions. *tps ×* is pg_idem's throughput over "
  "the base's (median of the rounds); *CPU ×* is the base's server CPU per request over "
  "pg_idem's (what a CPU-bound server's ratio would be, much less moved by the machine's "
  "other load). The hot-key floors have no lease (a winner always releases), so pg_idem "
  "does more there by design.")
P("")
rows = []
for sc, c, s_, label in ([("cycle", c, s_, "new-key cycle") for s_ in ("on", "off")
                          for c in (1, 4, 16)] +
                         [("intx", c, "on", "in-transaction cycle") for c in (1, 16)] +
                         [("replay", 4, "on", "replay"), ("renew", 4, "on", "renew"),
                          ("hot64", 16, "on", "64 hot keys"), ("hot1", 16, "on", "1 hot key")]):
    pi, mi, pl = (cell(sc, v, c, s_) for v in ("pg_idem", "minimal", "plpgsql"))
    if not pi:
        continue
    rows.append([label + (" (headline)" if sc == "cycle" and (c, s_) == HEADLINE else ""), c,
                 s_, fmt(pi["tps"], ".0f"), fmt(mi and mi["tps"], ".0f"),
                 fmt(pl and pl["tps"], ".0f"), fmt(ratio(pi, mi)),
                 fmt(cpu_ratio(sc, "pg_idem", "minimal", c, s_)), fmt(ratio(pi, pl)),
                 fmt(cpu_ratio(sc, "pg_idem", "plpgsql", c, s_)), fmt(pi["cpu_us_op"], ".0f"),
                 fmt(mi and mi["cpu_us_op"], ".0f"), fmt(pl and pl["cpu_us_op"], ".0f"),
                 fmt(pi["wal_bytes_op"], ".0f") + " / " + fmt(mi and mi["wal_bytes_op"], ".0f")])
table(["scenario", "clients", "sync commit", "pg_idem tps", "minimal tps", "PL/pgSQL tps",
       "÷ minimal, tps ×", "÷ minimal, CPU ×", "÷ PL/pgSQL, tps ×", "÷ PL/pgSQL, CPU ×",
       "pg_idem CPU µs/req", "minimal CPU µs/req", "PL/pgSQL CPU µs/req",
       "WAL B/req, pg_idem / minimal"], rows)


report_why.write(P, table, fsync_rates, mode)

# --------------------------------------------------------------------------
# The detail.
P("## New-key cycle: claim + finalize")
P("")
P("One request claims a new key, then finalizes it with a small JSON response: two round "
  "trips and, in lease mode, two commits. *sync commit* is `synchronous_commit`.")
P("")
for p in ("cycle_tps.png", "cycle_latency.png"):
    if p in plots:
        P(f"![{p}]({p})")
        P("")
cell_rows([f"cycle/{v}/c{c}/{s}" for s in ("on", "off") for c in (1, 4, 16) for v in VARIANTS])
P("Probes run beside the 1-client cells without flushes (what each piece costs):")
P("")
cell_rows([f"cycle/{v}/c1/off" for v in ("minimal", "floor", "floor_oc", "pg_idem",
                                         "pg_idem_notrig")])

P("## In-transaction mode: one commit per request")
P("")
P("`BEGIN; idem_begin(...); idem_finalize(..., strict => true); COMMIT` against lease mode's "
  "`idem_claim` (commit) and `idem_finalize` (commit). The floors' rows are their INSERT and "
  "UPDATE in one transaction: the most one commit fewer can buy; PL/pgSQL's are its claim "
  "and finalize functions between `BEGIN` and `COMMIT` (its table has no trigger to check "
  "at commit that the claim was finished).")
P("")
INTX_VARIANTS = ("minimal", "floor", "plpgsql", "pg_idem")
rows = []
for c in (1, 16):
    for v in INTX_VARIANTS:
        a, b = cell("intx", v, c), cell("cycle", v, c)
        if a and b:
            rows.append([NAMES[v], c, fmt(b["tps"], ".0f"), fmt(a["tps"], ".0f"),
                         fmt(ratio(a, b)), fmt(b["p50_ms"], ".3f"), fmt(a["p50_ms"], ".3f"),
                         fmt(b["wal_bytes_op"], ".0f"), fmt(a["wal_bytes_op"], ".0f")])
table(["variant", "clients", "lease-mode tps", "one-transaction tps", "ratio", "lease p50 ms",
       "one-transaction p50 ms", "lease WAL B/req", "one-transaction WAL B/req"], rows)
cell_rows([f"intx/{v}/c{c}/on" for c in (1, 16) for v in INTX_VARIANTS])

P("## Replay, hot keys, renew")
P("")
P("- **replay** (4 clients): a claim of one of 10 000 completed keys, answered with the "
  "stored response. The floor is a bare primary-key SELECT of the same rows of `idem_keys`, "
  "the minimal floor the same SELECT of the same rows seeded into its own table; "
  "the seed CTE's claim finds the key taken and a second statement reads it.")
P("- **hot 64 / hot 1** (16 clients): every request claims one of 64 keys, or the same key. "
  "A winner releases its claim (half the time) or dies without a word: its 5 ms lease runs "
  "out and the next request steals the key (`recovered_abandoned`); the others get "
  "`in_progress` (a seed CTE loser reads the row). The floors insert if absent and delete "
  "at once (they have no lease to die with).")
P("- **renew** (4 clients): lease renewal of one of 1 000 pending keys; the floors' is a "
  "bare primary-key UPDATE of `lease_expires_at`.")
P("")
if "scenarios.png" in plots:
    P("![scenarios.png](scenarios.png)")
    P("")
for sc, c, title in (("replay", 4, "Replay"), ("hot64", 16, "64 hot keys"),
                     ("hot1", 16, "1 hot key"), ("renew", 4, "Renew")):
    P(f"### {title}")
    P("")
    cell_rows([f"{sc}/{v}/c{c}/on" for v in VARIANTS + ["lookup"]])
    if sc.startswith("hot"):
        rows = []
        for v in VARIANTS:
            a, rs = cell(sc, v, c), cells.get(f"{sc}/{v}/c{c}/on", [])
            if not a or not a["txns"]:
                continue
            if v == "pg_idem" and any(r["outcomes"] for r in rs):
                o = defaultdict(int)
                for r in rs:
                    for k, n in r["outcomes"].items():
                        o[k] += n
                claimed, stolen = o["claimed"] + o["recovered_ttl"], o["recovered_abandoned"]
            else:
                # The others delete on release: an insert is a claim, an
                # update a steal.
                claimed, stolen = a["inserts"], a["updates"]
            rows.append([NAMES[v], a["txns"], claimed, stolen,
                         fmt(100.0 * (claimed + stolen) / a["txns"], ".1f") + " %"])
        P("Who got the key (all rounds; pg_idem from its `idem_stats` counters, the others "
          "from `pg_stat_user_tables`, their releases being deletes):")
        P("")
        table(["variant", "requests", "claimed", "stolen after a dead winner", "won"], rows)

P("## WAL per request")
P("")
if "wal.png" in plots:
    P("![wal.png](wal.png)")
    P("")
P("Record by record, one new-key cycle (`pg_waldump --stats=record` of each cell's first "
  "run, 1 client, synchronous commit on), per request:")
P("")
types = sorted({t for v in VARIANTS for t in waldumps.get(f"cycle/{v}/c1/on", ({}, 0))[0]})
rows = []
for t in types:
    row = [t]
    for v in VARIANTS:
        recs, txns = waldumps.get(f"cycle/{v}/c1/on", ({}, 0))
        n, rb, fb = recs.get(t, (0, 0, 0))
        row.append(f"{n / txns:.3f} × {(rb + fb) / n:.0f} B" if txns and n else "-")
    if any(x != "-" for x in row[1:]):
        rows.append(row)
table(["record type"] + [NAMES[v] for v in VARIANTS], rows)
P("Row updates per request in the new-key cycle (`n_tup_upd` / requests; the finalize is one):")
P("")
rows = []
for s_ in ("on", "off"):
    for c in (1, 4, 16):
        row = [f"{c} client{'s' if c > 1 else ''}, sync {s_}"]
        for v in VARIANTS:
            a = cell("cycle", v, c, s_)
            row.append(fmt(a["updates"] / a["txns"], ".3f") if a and a["txns"] else "-")
        rows.append(row)
table(["cell"] + [NAMES[v] for v in VARIANTS], rows)
extra = [(c, s_, a["updates"] / a["txns"] - 1) for s_ in ("on", "off") for c in (1, 4, 16)
         for a in [cell("cycle", "pg_idem", c, s_)] if a and a["txns"]]
if any(x > 0.02 for _, _, x in extra):
    worst = max(extra, key=lambda e: e[2])
    P(f"pg_idem updates more than one row per new key: up to {worst[2]:.2f} extra updates "
      f"per request ({worst[0]} clients, sync {worst[1]}), growing with concurrency. They "
      "are idem_claim's own: at this commit, `redraw_generation` in claims.c, an UPDATE "
      "that draws the generation again after the INSERT whenever any other session drew "
      "one in between (so under concurrency, for claims of unrelated keys too). Each costs "
      "a HOT update record and another `nextval`.")
    P("")

P("## Steady state: size bounded by cleanup")
P("")
P("pg_idem's new-key cycle offered at a constant rate by 4 clients with a short `idem.ttl`, "
  "autovacuum on (`autovacuum_naptime = 1s`), expired keys deleted by the cleanup worker "
  "(`idem.cleanup_interval = 1s`) or by a client calling `idem_cleanup(1000)` five times "
  "a second. After a warm-up (while the live set fills up to `idem.ttl` of traffic), three "
  "phases: steady; a transaction holding an xid open, so that vacuum can remove nothing "
  "deleted after it began; after it ends. *Live rows' size* is "
  "`sum(pg_column_size(row))` over the rows a fresh snapshot sees; since a cleanup pass "
  f"deletes a whole batch at once, the ratio divides by the largest live size of the last "
  f"{WINDOW} seconds (the table has to hold that peak). `steady_*.csv` has both.")
P("")
for name, st in steady.items():
    v, m = verdicts[name], st["meta"]
    P(f"### {LABEL.get(name, name)}")
    P("")
    P(f"Offered {m.get('rate')} requests/s, achieved {fmt(st['tps'], '.0f')} "
      f"({st['failed']} failed); `idem.ttl = {m.get('ttl')}`; a {m.get('warmup')} s warm-up, "
      f"then phases of {m.get('phase')} s. "
      f"Table + index against live rows' size: at most {fmt(v['steady_max'])} × in the "
      f"steady phase, up to {fmt(v['held_max'])} × while the long "
      f"transaction held vacuum back, {fmt(v['rec_end'])} × at the end; peak "
      f"{v['peak_mb']:.1f} MiB, end {fmt(v['end_mb'], '.1f')} MiB.")
    P("")
    if f"steady_{name}.png" in plots:
        P(f"![steady_{name}.png](steady_{name}.png)")
        P("")

P("## Outbox and follower wake-up")
P("")
P("### Outbox: stage, and drain at batch 1, 10, 100")
P("")
ob = [(k, a) for k, a in sorted(agg.items()) if a["scenario"].startswith("outbox")]
if ob:
    P("Staging: one `idem_outbox_stage` per request, 4 clients, each in a transaction of its "
      "own. Draining: 2 drainers, each iteration `idem_outbox_claim(batch)` (its own "
      "transaction) then `idem_outbox_ack(token, ids)`, from a backlog seeded before the run "
      "(events as `idem_outbox_stage` writes them). An event is staged once, or claimed and "
      "acked once (two updates).")
    P("")
    rows = []
    for k, a in ob:
        rs = cells[k]
        secs = sum(r["secs"] for r in rs)
        if a["scenario"] == "outbox_stage":
            events = a["inserts"]
        else:
            events = a["updates"] / 2
        seeded = sum(int(read_kv(os.path.join(runs_dir, r["run"], "meta")).get("rows") or 0)
                     for r in rs)
        dry = a["scenario"] != "outbox_stage" and seeded and events >= 0.95 * seeded
        wal = median([r["wal_bytes_op"] * r["txns"] for r in rs])
        rows.append([a["scenario"].replace("outbox_", ""), a["clients"],
                     fmt(events / secs if secs else None, ".0f") + (" (backlog ran out)"
                                                                   if dry else ""),
                     fmt(a["tps"], ".0f"), fmt(a["p50_ms"], ".3f"), fmt(a["p99_ms"], ".3f"),
                     fmt(a["cpu_us_op"], ".0f"),
                     fmt(wal * len(rs) / events if events and wal else None, ".0f"),
                     fmt(a["hot_pct"], ".1f")])
    table(["cell", "clients", "events/s", "requests/s", "p50 ms", "p99 ms", "CPU µs/req",
           "WAL B/event", "HOT %"], rows)
else:
    P("Not available in this build.")
    P("")

P("### Follower wake-up through the C++ client")
P("")
if wakeup:
    P("`client/cpp/bench/wakeup_bench.cpp` (`synchronous_commit = on`): a winner runs a 60 ms "
      "handler while followers wait "
      "on the same key; the latency runs from the moment the winner's `idem_finalize` has "
      "returned (committed: it is a transaction of its own) to each follower's return. The uncontended "
      "cycle (`tests/bench/client/cycle_bench.cpp`) runs new keys through `runner::run` with "
      "the wake-up on and off, alternating, with `synchronous_commit = off` (the wake-up "
      "changes no flush, and the disk's drift would drown what it does change).")
    P("")
    table(["wake-up", "rounds × followers", "p50 ms", "p99 ms", "max ms"],
          [[m, f"{w['rounds']} × {w['followers']}", fmt(w["p50"]), fmt(w["p99"]),
            fmt(w["max"])] for m, w in wakeup.items()])
    rows = [[rnd, fmt(r.get("advisory_lock"), ".0f"), fmt(r.get("polling"), ".0f"),
             fmt(r["advisory_lock"] / r["polling"] if r.get("advisory_lock") and
                 r.get("polling") else None, ".3f")] for rnd, r in sorted(client_cycle.items())]
    table(["round", "with wake-up, requests/s", "polling only, requests/s", "ratio"], rows)
else:
    P("Not available in this build.")
    P("")

P("## Machine and settings")
P("")
table(["", ""], [
    ["date", machine.get("date")],
    ["CPU", f"{machine.get('cpu')}, {machine.get('nproc')} cores (nproc)"],
    ["memory", machine.get("memory")],
    ["kernel", machine.get("kernel")],
    ["PostgreSQL", machine.get("postgres")],
    ["pg_test_fsync, one 8 kB write",
     "; ".join(f"{k} {v[0]:.0f}/s ({v[1]} µs)" for k, v in fsync_rates.items()) or "-"],
    ["load average", f"{machine.get('load_start')} → {machine.get('load_end')}"],
])
P("The cluster is a throwaway one the runner starts (`initdb`, no data checksums), reached "
  "over its Unix socket. Settings that are not PostgreSQL's defaults, and a few that matter "
  "here:")
P("")
table(["setting", "value", "unit", "source"],
      [[s[0], f"`{s[1]}`"] + (s[2:] + ["", ""])[:2] for s in settings])
P("`autovacuum` and the cleanup worker are off while the matrix runs (every run starts from "
  "an emptied table; a vacuum landing in one run's WAL and CPU would skew it) and on for "
  "the steady state. `track_wal_io_timing` is on for the flush times.")
P("")
P("## What each number means")
P("")
P("- **tps**: requests per second, the median of the rounds. A request is one pass of the "
  "pgbench script (in lease mode, two SQL transactions); `-M prepared`; a new random key "
  "per request (`sha256(int8send(random))`).")
P("- **spread**: (max − min) / median of the rounds' tps.")
P("- **p50 / p99**: request latency percentiles from pgbench's per-transaction log, median "
  "of the rounds.")
P("- **CPU µs/req**: server CPU per request: the CPU time of the backends that served the "
  "run (user + system, as the postmaster accounts its exited children) divided by the "
  "requests; pgbench's own CPU is not in it.")
P("- **WAL B/req**: `pg_current_wal_lsn()` advance over the run per request. **FPI/req**, "
  "**WAL rec/req**: `pg_stat_wal.wal_fpi` and `wal_records` per request. No checkpoint "
  "happens during a run. A run starts on its freshly emptied table, whose pages are all "
  "new and need no full-page image, or, when it starts from seeded rows (replay, renew, "
  "outbox drain), right after a CHECKPOINT: FPIs are those of pages that existed at the "
  "checkpoint, in its first seconds.")
P("- **flush ms**: the average time of one WAL flush during the run "
  "(`pg_stat_wal.wal_sync_time / wal_sync`, `track_wal_io_timing = on`): the disk's speed "
  "at that moment, which other engineers' work changes from minute to minute.")
P("- **HOT %**: `n_tup_hot_upd / n_tup_upd` over all rounds; in the cycle the updates are "
  "the finalizes.")
P("- **table+index KiB**, **B/row**: `pg_table_size + pg_indexes_size` after the run, and "
  "that divided by `n_live_tup`.")
P("- **failed**: pgbench's failed transactions (serialization failures, not retried).")
P("")
P("Variants: **minimal floor** (`bench.idem_minimal`, issue 13's base) the floor's bare "
  "statements on a table with idem_keys' columns (names, types, NOT NULL, defaults) and "
  "primary key `(cache_key, scope)` only: no CHECK constraint, no trigger, no other index, "
  "`fillfactor = 70` (`setup.sql` refuses to run if it is anything else). The others are "
  "each on a table shaped exactly like `idem_keys` (columns, defaults, "
  "constraints, primary key, `fillfactor`; only idem_keys has pg_idem's in-transaction "
  "trigger): **floor** (`bench.idem_floor`) a bare INSERT of the pending row and a bare "
  "UPDATE to completed by primary key; **seed CTE** (`bench.idem_cte`) the claim CTE "
  "of a service's hand-written design (the seed pg_idem replaces) sent as client SQL with a "
  "client-made claim id, then the seed's owner-scoped "
  "finalize (the seed has no `generation`: it writes 1, and +1 on recovery); **PL/pgSQL** "
  "(`bench.idem_plpgsql`) pg_idem's protocol as PL/pgSQL functions; **pg_idem** "
  "(`idem_keys`). All write the same row content. Sources: `tests/bench/sql/setup.sql`, "
  "`tests/bench/scripts/`.")

with open(os.path.join(RESULTS, "results.md"), "w") as f:
    f.write("\n".join(md).rstrip() + "\n")

# The runner's pass/fail table.
width = max(len(t[0]) for t in targets)
print()
print(f"{'target':<{width}}  result  measured")
for t, m, v in targets:
    print(f"{t:<{width}}  {v:<6}  {m}")
print()
print(f"results: {os.path.join(RESULTS, 'results.md')}")
