"""One benchmark run's measurements, for report.py and its sections: the
pgbench runs under WORK/runs/, the cells (the median of a cell's rounds), the
steady-state samples, and the accessors that read them.

load() fills the containers below in place, so that a module that imported
them before the load reads this run's numbers through them."""
import csv
import os
import re
import statistics
from collections import defaultdict

VARIANTS = ["minimal", "floor", "cte", "plpgsql", "pg_idem"]
NAMES = {"minimal": "minimal floor", "floor": "floor", "cte": "seed CTE", "plpgsql": "PL/pgSQL",
         "pg_idem": "pg_idem", "-": "-", "floor_oc": "probe: floor + ON CONFLICT",
         "pg_idem_notrig": "probe: pg_idem without its trigger",
         "lookup": "probe: idem_lookup", "sql_edition": "SQL edition"}
SNAPSHOT = ["lsn", "wal_records", "wal_fpi", "wal_bytes", "ins", "upd", "hot_upd", "del",
            "live", "dead", "table_bytes", "index_bytes", "wal_sync", "wal_sync_us"]
CYCLE_POINTS = [(c, s) for s in ("on", "off") for c in (1, 4, 16)]

# Steady state.  The live rows' size swings with every cleanup pass (a
# whole batch of keys goes at once), and the table must hold the peak: the
# ratio at second t divides the size by the largest live size of the last
# WINDOW seconds.
WINDOW = 3

runs = []                                               # one dict per pgbench run
statements = defaultdict(lambda: defaultdict(list))     # cell -> statement -> [ms]
waldumps = {}                                           # cell -> ({type: (n, rb, fb)}, txns)
cells = defaultdict(list)                               # cell -> its runs
agg = {}                                                # cell -> the medians of its runs
steady = {}                                             # steady phase name -> samples, tps


def read_kv(path):
    """key=value lines (and space-separated key=value pairs) of a file."""
    out = {}
    if os.path.exists(path):
        for line in open(path):
            line = line.rstrip("\n")
            if re.match(r"^\w+=\S*( \w+=\S*)+$", line):
                for part in line.split():
                    k, _, v = part.partition("=")
                    out[k] = v
            else:
                k, _, v = line.partition("=")
                out[k] = v
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def parse_pgbench(text):
    """Transactions, failures, tps and per-statement latencies of one run."""
    out = {"txns": 0, "failed": 0, "tps": 0.0, "statements": [], "error": None}
    m = re.search(r"number of transactions actually processed: (\d+)", text)
    if m:
        out["txns"] = int(m.group(1))
    m = re.search(r"number of failed transactions: (\d+)", text)
    if m:
        out["failed"] = int(m.group(1))
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
    if m:
        out["tps"] = float(m.group(1))
    m = re.search(r"(?m)^pgbench: error: (.*)$", text)
    if m:
        out["error"] = m.group(1)
    section = text.split("statement latencies in milliseconds", 1)
    if len(section) == 2:
        for line in section[1].splitlines()[1:]:
            m = re.match(r"\s+([\d.]+)\s+(\d+)\s+(.*)$", line)
            if m and not m.group(3).startswith("\\"):
                out["statements"].append((float(m.group(1)), m.group(3).strip()))
    return out


def parse_waldump(text):
    """Per record type: records, record bytes, FPI bytes."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s+(\d+) \(\s*[\d.]+\)\s+(\d+) \(\s*[\d.]+\)\s+(\d+) \(\s*[\d.]+\)",
                     line)
        if m and m.group(1) not in ("Type", "Total"):
            rows[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    return rows


def write_csv(raw, name, fields, rows):
    with open(os.path.join(raw, name), "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


def load(work, raw, plotdata):
    """Read WORK/runs/ and WORK/steady/ into the containers above; write
    their CSVs into raw/ and the steady-state plot data into plotdata/."""
    runs_dir = os.path.join(work, "runs")
    for name in sorted(os.listdir(runs_dir)):
        d = os.path.join(runs_dir, name)
        meta = read_kv(os.path.join(d, "meta"))
        try:
            snaps = [open(os.path.join(d, f)).read().strip().partition(";") for f in ("before", "after")]
            before, after = (dict(zip(SNAPSHOT, map(int, n.split(",")))) for n, _, _ in snaps)
        except (OSError, ValueError):
            continue
        outcomes = [dict(kv.split("=") for kv in o.split()) for _, _, o in snaps]
        pgb = parse_pgbench(open(os.path.join(d, "pgbench.out")).read())
        lat = open(os.path.join(d, "latency")).read().split()
        cell = f"{meta['scenario']}/{meta['variant']}/c{meta['clients']}/{meta['sync']}"
        txns = pgb["txns"]
        delta = {k: after[k] - before[k] for k in SNAPSHOT}
        run = {
            "run": name, "cell": cell, "scenario": meta["scenario"], "variant": meta["variant"],
            "clients": int(meta["clients"]), "sync": meta["sync"], "round": int(meta["round"]),
            "secs": int(meta["secs"]), "table": meta["table"], "txns": txns, "failed": pgb["failed"],
            "tps": pgb["tps"], "p50_ms": int(lat[1]) / 1000.0, "p99_ms": int(lat[2]) / 1000.0,
            "cpu_us_op": float(meta.get("cpu_seconds") or 0) * 1e6 / txns if txns else None,
            "wal_bytes_op": delta["lsn"] / txns if txns else None,
            "wal_records_op": delta["wal_records"] / txns if txns else None,
            "fpi_op": delta["wal_fpi"] / txns if txns else None,
            "d_ins": delta["ins"], "d_upd": delta["upd"], "d_hot": delta["hot_upd"],
            "d_del": delta["del"],
            "flush_ms": delta["wal_sync_us"] / delta["wal_sync"] / 1000 if delta["wal_sync"] else None,
            "size_bytes": after["table_bytes"] + after["index_bytes"], "rows": after["live"],
            "load1": open(os.path.join(d, "load")).read().strip(),
            "error": pgb["error"] or meta.get("pgbench_exit", ""),
            "outcomes": {k: int(outcomes[1].get(k, 0)) - int(outcomes[0].get(k, 0))
                         for k in outcomes[1]},
        }
        run["claim_outcomes"] = " ".join(f"{k}={n}" for k, n in sorted(run["outcomes"].items()) if n)
        for k in SNAPSHOT:
            run["before_" + k] = before[k]
            run["after_" + k] = after[k]
        runs.append(run)
        for ms, text in pgb["statements"]:
            statements[cell][text].append(ms)
        if os.path.exists(os.path.join(d, "waldump")):
            waldumps[cell] = (parse_waldump(open(os.path.join(d, "waldump")).read()), txns)

    write_csv(raw, "runs.csv",
              ["run", "cell", "scenario", "variant", "clients", "sync", "round", "secs", "table",
               "txns", "failed", "tps", "p50_ms", "p99_ms", "cpu_us_op", "flush_ms",
               "wal_bytes_op", "wal_records_op", "fpi_op", "d_ins", "d_upd", "d_hot", "d_del",
               "size_bytes",
               "rows", "load1", "error", "claim_outcomes"] +
              ["before_" + k for k in SNAPSHOT] + ["after_" + k for k in SNAPSHOT], runs)

    for r in runs:
        cells[r["cell"]].append(r)
    for key, rs in cells.items():
        tps = [r["tps"] for r in rs]
        upd = sum(r["d_upd"] for r in rs)
        med = median(tps)
        agg[key] = {
            "cell": key, "scenario": rs[0]["scenario"], "variant": rs[0]["variant"],
            "clients": rs[0]["clients"], "sync": rs[0]["sync"], "rounds": len(rs),
            "tps": med, "tps_min": min(tps), "tps_max": max(tps),
            "spread": (max(tps) - min(tps)) / med if med else None,
            "p50_ms": median([r["p50_ms"] for r in rs]),
            "p99_ms": median([r["p99_ms"] for r in rs]),
            "cpu_us_op": median([r["cpu_us_op"] for r in rs]),
            "cpu_noise": (max(r["cpu_us_op"] or 0 for r in rs) -
                          min(r["cpu_us_op"] or 0 for r in rs)) / 2,
            "flush_ms": median([r["flush_ms"] for r in rs]),
            "wal_bytes_op": median([r["wal_bytes_op"] for r in rs]),
            "wal_records_op": median([r["wal_records_op"] for r in rs]),
            "fpi_op": median([r["fpi_op"] for r in rs]),
            "hot_pct": 100.0 * sum(r["d_hot"] for r in rs) / upd if upd else None,
            "updates": upd, "hot_updates": sum(r["d_hot"] for r in rs),
            "inserts": sum(r["d_ins"] for r in rs),
            "size_bytes": median([r["size_bytes"] for r in rs]),
            "bytes_row": median([r["size_bytes"] / r["rows"] if r["rows"] else None for r in rs]),
            "txns": sum(r["txns"] for r in rs), "failed": sum(r["failed"] for r in rs),
            "errors": "; ".join(sorted({r["error"] for r in rs if r["error"]})),
        }
    write_csv(raw, "cells.csv",
              ["cell", "scenario", "variant", "clients", "sync", "rounds", "tps", "tps_min",
               "tps_max", "spread", "p50_ms", "p99_ms", "cpu_us_op", "flush_ms", "wal_bytes_op",
               "wal_records_op", "fpi_op", "hot_pct", "updates", "inserts", "size_bytes",
               "bytes_row", "txns", "failed", "errors"], [agg[k] for k in sorted(agg)])
    write_csv(raw, "statements.csv", ["cell", "statement", "median_ms"],
              [{"cell": c, "statement": t[:120], "median_ms": median(v)}
               for c in sorted(statements) for t, v in statements[c].items()])
    write_csv(raw, "wal_records.csv",
              ["cell", "record_type", "records", "record_bytes", "fpi_bytes", "records_op",
               "bytes_op"],
              [{"cell": c, "record_type": t, "records": n, "record_bytes": rb, "fpi_bytes": fb,
                "records_op": n / txns if txns else None,
                "bytes_op": (rb + fb) / txns if txns else None}
               for c in sorted(waldumps) for t, (n, rb, fb) in sorted(waldumps[c][0].items())
               for txns in [waldumps[c][1]] if n])

    steady_dir = os.path.join(work, "steady")
    for name in sorted(os.listdir(steady_dir)) if os.path.isdir(steady_dir) else []:
        d = os.path.join(steady_dir, name)
        meta = read_kv(os.path.join(d, "meta"))
        samples = []
        for line in open(os.path.join(d, "samples")):
            f = line.strip().split(",")
            if len(f) != 9:
                continue
            table, index, rows, live, dead, vacuums, lsn = map(int, f[2:])
            samples.append({"t": int(f[0]), "phase": f[1], "table": table, "index": index,
                            "rows": rows, "live": live, "dead": dead, "vacuums": vacuums,
                            "lsn": lsn})
        for i, s in enumerate(samples):
            peak = max(x["live"] for x in samples[max(0, i - WINDOW + 1):i + 1])
            s["peak_live"] = peak
            s["ratio"] = (s["table"] + s["index"]) / peak if peak else None
            s["ratio_now"] = (s["table"] + s["index"]) / s["live"] if s["live"] else None
        pgb = parse_pgbench(open(os.path.join(d, "pgbench.out")).read())
        steady[name] = {"meta": meta, "samples": samples, "tps": pgb["tps"], "failed": pgb["failed"]}
        write_csv(raw, f"steady_{name}.csv", ["t", "phase", "table", "index", "rows", "live",
                                              "peak_live", "dead", "vacuums", "lsn", "ratio",
                                              "ratio_now"], samples)
        with open(os.path.join(plotdata, f"steady_{name}.dat"), "w") as f:
            for s in samples:
                f.write(f"{s['t']} {s['table'] / 1048576:.3f} {s['index'] / 1048576:.3f} "
                        f"{3 * s['peak_live'] / 1048576:.3f} {s['live'] / 1048576:.3f} "
                        f"{s['dead']}\n")


def cell(scenario, variant, clients, sync="on"):
    return agg.get(f"{scenario}/{variant}/c{clients}/{sync}")


def get(scenario, variant, clients, key, sync="on"):
    c = cell(scenario, variant, clients, sync)
    return c.get(key) if c else None


def ratio(a, b, key="tps"):
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


def stmt_ms(scenario, variant, clients, sync, prefix):
    """Median latency of the first statement of a cell starting with prefix."""
    for text, values in statements.get(f"{scenario}/{variant}/c{clients}/{sync}", {}).items():
        if text.startswith(prefix):
            return median(values)
    return None


def cpu_ratio(scenario, variant, base, clients, sync="on"):
    """base's server CPU per request over variant's: the throughput ratio a
    CPU-bound server would show, much less disturbed by the machine's
    other load than tps."""
    return ratio(cell(scenario, base, clients, sync), cell(scenario, variant, clients, sync),
                 "cpu_us_op")


def span(vals):
    vals = [v for v in vals if v is not None]
    return f"{min(vals):.2f}–{max(vals):.2f}" if vals else "-"


def steady_verdict(st):
    """The steady phase's worst ratio (the warm-up excluded), the worst
    while the long transaction holds vacuum back, and how the recovery
    phase ends."""
    ss = st["samples"]
    in_steady = [s for s in ss if s["phase"] == "steady" and s["ratio"]]
    held = [s for s in ss if s["phase"] == "held" and s["ratio"]]
    rec = [s for s in ss if s["phase"] == "recovery" and s["ratio"]]
    out = {"steady_max": max((s["ratio"] for s in in_steady), default=None),
           "steady_now_max": max((s["ratio_now"] for s in in_steady), default=None),
           "worst": max(in_steady, key=lambda s: s["ratio"]) if in_steady else None,
           "held_max": max((s["ratio"] for s in held), default=None),
           "rec_end": median([s["ratio"] for s in rec[-WINDOW:]]) if rec else None,
           "peak_mb": max((s["table"] + s["index"] for s in ss), default=0) / 1048576,
           "end_mb": (ss[-1]["table"] + ss[-1]["index"]) / 1048576 if ss else None,
           "steady_index_mb": in_steady[-1]["index"] / 1048576 if in_steady else None,
           "end_dead": ss[-1]["dead"] if ss else None,
           "steady_dead": max((s["dead"] for s in ss if s["phase"] == "steady"), default=0),
           "held_mb": max((s["table"] + s["index"] for s in held), default=0) / 1048576}
    return out
