#!/usr/bin/env python3
"""growth_report.py OUT RESULTS PLOTS: make bench's growth section as a page.

Reads what tests/bench/growth.sh wrote in OUT (clients.csv, shapes.csv,
pileup.csv, pacing.csv, wakeup.csv, wakeup_harness.csv, machine.txt), writes
RESULTS/growth.md, the plots RESULTS/growth_clients.png and
RESULTS/growth_pileup.png (gnuplot scripts in PLOTS), and copies the CSVs
to RESULTS/raw/growth/.  Ratios are of
medians over the rounds, pg_idem against the baseline of the same round.
"""
import csv
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict

BASE = {"cycle": "minimal", "replay": "floor", "hotreplay": "floor"}
TITLES = {"cycle": "new-key cycle (/ minimal floor's INSERT+UPDATE)",
          "replay": "replay (/ bare primary-key SELECT)",
          "hotreplay": "hot key, every client the same (/ bare SELECT of it)"}


def read(path):
    """A CSV's rows; none for a missing file, and no row a cut-off line left short."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def pacing_judged(rows):
    """pacing.csv's phases that can be judged, by (keys, phase): each as
    (row, its p99 over its own round's quiet p99, that quiet p99 in µs).  A
    round counts when both phases ran (a failed pgbench run records p99 0).
    The page's pacing section and make bench's targets table both read it."""
    quiet = {(r["keys"], r["round"]): int(r["p99_us"]) for r in rows
             if r["delay_ms"] == "quiet" and int(r["p99_us"]) > 0}
    judged = defaultdict(list)
    for r in rows:
        q = quiet.get((r["keys"], r["round"]))
        if r["delay_ms"] != "quiet" and int(r["p99_us"]) > 0 and q:
            judged[(int(r["keys"]), r["delay_ms"])].append((r, int(r["p99_us"]) / q, q))
    return judged


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * p + 0.5) - 1 if p < 1 else len(values) - 1)]


def clients_section(rows, lines, plots_in):
    cells = defaultdict(list)
    for r in rows:
        cells[(r["scenario"], r["variant"], int(r["clients"]))].append(
            (float(r["tps"] or 0), int(r["p50_us"]), int(r["p99_us"])))
    counts = sorted({c for (_, _, c) in cells})
    lines.append("## Throughput and latency by number of clients\n")
    lines.append("Requests per second, median over the rounds; the ratio is pg_idem's "
                 "over the baseline's; p99 in ms (pg_idem / baseline).\n")
    data = []
    for scenario, base in BASE.items():
        lines.append(f"### {TITLES[scenario]}\n")
        lines.append("| clients | pg_idem tps | baseline tps | ratio | p99 ms pg_idem / baseline |")
        lines.append("|---|---|---|---|---|")
        for c in counts:
            ours, theirs = cells.get((scenario, "pg_idem", c)), cells.get((scenario, base, c))
            if not ours or not theirs:
                continue
            t1 = statistics.median(x[0] for x in ours)
            t0 = statistics.median(x[0] for x in theirs)
            p1 = statistics.median(x[2] for x in ours) / 1000
            p0 = statistics.median(x[2] for x in theirs) / 1000
            ratio = t1 / t0 if t0 else float("nan")
            lines.append(f"| {c} | {t1:.0f} | {t0:.0f} | {ratio:.2f} | {p1:.2f} / {p0:.2f} |")
            data.append((scenario, c, ratio))
        lines.append("")
    with open(plots_in, "w") as f:
        for scenario in BASE:
            for s, c, ratio in data:
                if s == scenario:
                    f.write(f"{c} {ratio:.4f}\n")
            f.write("\n\n")


def pileup_section(rows, waits, lines, plots_in):
    if not rows:
        return
    lines.append("## Keys piling up, and the cleanup deleting a backlog\n")
    lines.append("The claim cycle at 4 clients with N completed keys in idem_keys: quiet; "
                 "beside one session burning CPU and writing nothing (`cpu`, a control); "
                 "while one session runs idem_cleanup(10000) back to back on a backlog "
                 "of N/2 keys past their horizon (target: p99 during cleanup <= 2 x quiet); "
                 "and then beside one session writing, and doing nothing else, as much WAL per "
                 "second as the cleanup added (`wal`, the other control: 8 kB logical messages, "
                 "on the table the cleanup left). WAL is all sessions' over the phase.\n")
    lines.append("| keys | phase | tps | p50 ms | p99 ms | p99 / quiet | cleanup keys/s "
                 "| WAL MB | full-page images | table MB | indexes MB |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    quiet = {}
    with open(plots_in, "w") as f:
        for r in rows:
            n, phase = int(r["keys"]), r["phase"]
            p99 = int(r["p99_us"]) / 1000
            if phase == "quiet":
                quiet[n] = p99
            rel = f"{p99 / quiet[n]:.2f}" if phase != "quiet" and quiet.get(n) else ""
            speed = r["cleanup_keys_per_s"] if phase == "cleanup" else ""
            lines.append(f"| {n:,} | {phase} | {float(r['tps'] or 0):.0f} | {int(r['p50_us']) / 1000:.2f} "
                         f"| {p99:.2f} | {rel} | {speed} | {r.get('wal_mb', '')} | {r.get('wal_fpi', '')} "
                         f"| {r['table_mb']} | {r['indexes_mb']} |")
            f.write(f"{n} {phase} {int(r['p50_us']) / 1000:.3f} {p99:.3f}\n")
    lines.append("")
    if not waits:
        return
    # What the claims' backends were doing, as shares of the samples.
    per = defaultdict(lambda: defaultdict(int))
    for w in waits:
        per[(int(w["keys"]), w["phase"])][w["wait"]] += int(w["samples"])
    top = defaultdict(int)
    for counts in per.values():
        total = sum(counts.values())
        for k, v in counts.items():
            top[k] += v / total
    names = sorted(top, key=lambda k: -top[k])[:6]
    lines.append("What the claims' backends were doing (pg_stat_activity of the active "
                 "ones, sampled every 10 ms; `CPU` is no wait event: running, or waiting "
                 "for a core), share of the samples:\n")
    lines.append("| keys | phase | samples | " + " | ".join(names) + " | other |")
    lines.append("|---|---|---|" + "---|" * (len(names) + 1))
    for (n, phase), counts in per.items():
        total = sum(counts.values())
        cells = [f"{counts.get(k, 0) / total:.0%}" for k in names]
        other = 1 - sum(counts.get(k, 0) for k in names) / total
        lines.append(f"| {n:,} | {phase} | {total} | " + " | ".join(cells) + f" | {other:.0%} |")
    lines.append("")


def pacing_section(rows, buffer_rows, lines):
    """The claims' p99 during the worker's cleanup at each idem.cleanup_delay,
    over the quiet p99 of the same round (median and range of the rounds),
    and what each phase did to shared_buffers (pacing_buffers.csv, when the
    run recorded it)."""
    if not rows:
        return
    buffers = defaultdict(list)
    for r in buffer_rows:
        buffers[(int(r["keys"]), r["delay_ms"])].append(r)
    def buffer_median(cell, column):
        values = [int(r[column]) for r in buffers.get(cell, []) if r[column] not in ("", None)]
        return f"{statistics.median(values):,.0f}" if values else ""
    lines.append("## Pacing the cleanup (idem.cleanup_delay)\n")
    lines.append("The claim cycle at 4 clients with N completed keys in idem_keys while the "
                 "cleanup worker deletes a backlog of N/2 keys past their horizon, at each "
                 "`idem.cleanup_delay` (`idem.cleanup_batch` 1000, a pass every second), and "
                 "quiet (no worker), the phases' order turning each round; every phase starts "
                 "from the same backlog. *p99 / quiet*: each phase's p99 over its own round's "
                 "quiet p99, median of the rounds (lowest and highest). *keys/s*: what the "
                 "worker deleted over the phase, passes and the launcher's second between them "
                 "included (issue 35's target: p99 / quiet <= 1.5 at 1 M and 10 M keys at "
                 "the default delay, 200 ms; `make bench MODE=medium` and `MODE=full` "
                 "measure 10 M, or `PACING_SIZES`). *Blocks read*: read into shared_buffers "
                 "by every session over the phase (pg_stat_database); *backend writes*: dirty "
                 "buffers a session had to write out to get a free one (pg_stat_bgwriter's "
                 "buffers_backend), medians of the rounds.\n")
    lines.append("| keys | idem.cleanup_delay | rounds | tps | p50 ms | p99 ms | p99 / quiet "
                 "| cleanup keys/s | blocks read | backend writes |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    judged = pacing_judged(rows)
    cells = defaultdict(list)
    for r in rows:
        cells[(int(r["keys"]), r["delay_ms"])].append(r)
    # A phase is quiet, a delay in ms, or DELAY:BATCH (idem.cleanup_batch set too).
    order = lambda k: (k[0], -1 if k[1] == "quiet" else int(k[1].split(":")[0]),
                       int(k[1].split(":")[1]) if ":" in k[1] else 0)
    for (n, delay) in sorted(cells, key=order):
        rs = cells[(n, delay)]
        ratios = [ratio for _, ratio, _ in judged.get((n, delay), [])]
        rel = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
               if ratios else "")
        speed = (f"{statistics.median(int(r['cleanup_keys_per_s']) for r in rs):,}"
                 if delay != "quiet" else "")
        label = ("quiet (no worker)" if delay == "quiet" else
                 f"{delay.split(':')[0]} ms, batch {delay.split(':')[1]}" if ":" in delay else
                 f"{delay} ms")
        lines.append(f"| {n:,} | {label} | {len(rs)} "
                     f"| {statistics.median(float(r['tps'] or 0) for r in rs):.0f} "
                     f"| {statistics.median(int(r['p50_us']) for r in rs) / 1000:.2f} "
                     f"| {statistics.median(int(r['p99_us']) for r in rs) / 1000:.2f} "
                     f"| {rel} | {speed} | {buffer_median((n, delay), 'blks_read')} "
                     f"| {buffer_median((n, delay), 'buffers_backend')} |")
    lines.append("")


def shapes_section(rows, lines):
    if not rows:
        return
    lines.append("## The replay's call shapes\n")
    lines.append("Server CPU per call (one client, the backend's CPU time after it exits), "
                 "median over the rounds, and its ratio to the bare primary-key SELECT's.\n")
    per = defaultdict(list)
    for r in rows:
        per[r["shape"]].append(int(r["cpu_ticks"]) / int(r["ticks_per_s"]) / int(r["calls"]) * 1e6)
    base = statistics.median(per.get("replay-floor", [float("nan")]))
    names = {"replay-floor": "bare SELECT (baseline)",
             "replay-pg_idem": "SELECT * FROM idem_claim(...) (what the clients send)",
             "replayshape-composite": "SELECT idem_claim(...) (one composite value)",
             "replayshape-subquery": "SELECT (r).* FROM (SELECT idem_claim(...) r OFFSET 0) s"}
    lines.append("| shape | µs of server CPU per call | / bare SELECT |")
    lines.append("|---|---|---|")
    for shape, label in names.items():
        if shape in per:
            us = statistics.median(per[shape])
            lines.append(f"| {label} | {us:.1f} | {us / base:.2f} |")
    lines.append("")


def wakeup_cells(rows):
    """(harness, path, followers) -> what its rounds measured."""
    cells = defaultdict(lambda: {"ms": [], "server": [], "fin": {}, "cpu": {}, "wakes": {},
                                 "switches": {}, "by_round": defaultdict(list),
                                 "outcomes": defaultdict(int)})
    for r in rows:
        c = cells[(r.get("harness") or "threads", r["path"], int(r["followers"]))]
        c["ms"].append(float(r["ms"]))
        c["by_round"][r["round"]].append(float(r["ms"]))
        c["outcomes"][r["outcome"]] += 1
        if r.get("server_ms") not in (None, "", "nan"):
            c["server"].append(float(r["server_ms"]))
        if r.get("finalize_ms"):
            c["fin"][r["round"]] = float(r["finalize_ms"])
        if r.get("cpu_us"):
            c["cpu"][r["round"]] = float(r["cpu_us"])
        if r.get("slept"):
            c["wakes"][r["round"]] = (int(r["slept"]), int(r["woken"]))
        if r.get("switches"):
            c["switches"][r["round"]] = int(r["switches"])
    return cells


def median_of(d, fmt=".0f"):
    return format(statistics.median(d.values()), fmt) if d else ""


def backend(c):
    return f"{pct(c['server'], 0.5):.1f} / {pct(c['server'], 0.99):.1f}" if c["server"] else ""


def wakeup_section(rows, harness_rows, lines):
    if not rows:
        return
    lines.append("## Follower wake-up\n")
    lines.append("Time from the winner sending its finalize to each follower's answer reaching "
                 "the harness (followers waiting inside idem_claim, one warm connection each, "
                 "all driven by one thread: tests/bench/growth_wakeup.py). *Backend*: when "
                 "the follower's backend had its answer (clock_timestamp() after the wait). "
                 "*Finalize*: when the winner's commit, which wakes them, returned to it. "
                 "*CPU*: what the sleeping followers' backends ran from the finalize to the "
                 "last answer, per follower, median of the rounds. *Slept / woken*: followers "
                 "that slept in the server and sleeps a commit ended (idem_stats), over the "
                 "rounds. Through PgBouncer only the pool's 5 wait on a server at once; the "
                 "rest queue in the pooler and replay.\n")
    lines.append("| path | followers | answers | p50 ms | p99 ms | max ms | backend p50 / p99 ms "
                 "| finalize p50 ms | CPU µs | slept / woken | outcomes |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    cells = wakeup_cells(rows)
    for (harness, path, n), c in sorted(cells.items()):
        if harness != "loop":
            continue
        o = ", ".join(f"{name} {v}" for name, v in sorted(c["outcomes"].items()))
        w = (f"{sum(a for a, _ in c['wakes'].values())} / {sum(b for _, b in c['wakes'].values())}"
             if c["wakes"] else "")
        lines.append(f"| {path} | {n} | {len(c['ms'])} | {pct(c['ms'], 0.5):.1f} "
                     f"| {pct(c['ms'], 0.99):.1f} | {max(c['ms']):.1f} | {backend(c)} "
                     f"| {median_of(c['fin'], '.1f')} | {median_of(c['cpu'])} | {w} | {o} |")
    lines.append("")
    if not harness_rows:
        return
    lines.append("### What the harness adds\n")
    lines.append("The same 100 followers, directly, the three harnesses interleaved round by "
                 "round: *threads* is the first version of the harness (a Python thread and a "
                 "new connection per follower per round), *fresh* one thread on new "
                 "connections every round, *loop* the table above. *Rounds' p99*: the median of "
                 "the rounds' own p99 (one round disturbed by the machine moves it less). "
                 "*Blocked*: how often the harness's threads blocked from the finalize to their "
                 "answers, per round (median).\n")
    lines.append("| harness | answers | p50 ms | p99 ms | rounds' p99 ms | backend p50 / p99 ms "
                 "| CPU µs | blocked |")
    lines.append("|---|---|---|---|---|---|---|---|")
    names = {"threads": "threads (the first version)", "fresh": "fresh", "loop": "loop"}
    cells = wakeup_cells(harness_rows)
    for harness in ("threads", "fresh", "loop"):
        for (h, path, n), c in sorted(cells.items()):
            if h == harness:
                rounds = statistics.median(pct(v, 0.99) for v in c["by_round"].values())
                lines.append(f"| {names[h]} | {len(c['ms'])} | {pct(c['ms'], 0.5):.1f} "
                             f"| {pct(c['ms'], 0.99):.1f} | {rounds:.1f} | {backend(c)} "
                             f"| {median_of(c['cpu'])} | {median_of(c['switches'])} |")
    lines.append("")


def main():
    out, results, plots = sys.argv[1:4]
    machine = open(os.path.join(out, "machine.txt")).read().strip().splitlines()
    lines = ["# pg_idem benchmark: cost as the work grows", "",
             "Written by `make bench` (tests/bench/growth.sh); every ratio is within one "
             "run, the variants interleaved. The machine:", ""]
    lines += [f"- {m}" for m in machine] + [""]
    clients_section(read(os.path.join(out, "clients.csv")), lines, os.path.join(out, "clients.dat"))
    shapes_section(read(os.path.join(out, "shapes.csv")), lines)
    pileup_section(read(os.path.join(out, "pileup.csv")),
                   read(os.path.join(out, "pileup_waits.csv")), lines, os.path.join(out, "pileup.dat"))
    pacing_section(read(os.path.join(out, "pacing.csv")), read(os.path.join(out, "pacing_buffers.csv")),
                   lines)
    wakeup_section(read(os.path.join(out, "wakeup.csv")),
                   read(os.path.join(out, "wakeup_harness.csv")), lines)
    os.makedirs(os.path.join(results, "raw", "growth"), exist_ok=True)
    for name in ("clients.csv", "shapes.csv", "pileup.csv", "pileup_waits.csv", "pacing.csv", "pacing_buffers.csv", "wakeup.csv",
                 "wakeup_harness.csv",
                 "machine.txt"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copy(os.path.join(out, name), os.path.join(results, "raw", "growth", name))
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", "-e", f"data='{out}/clients.dat'; out='{results}/growth_clients.png'",
                        os.path.join(plots, "growth_clients.gp")], check=False)
        lines.append("![pg_idem / baseline by clients](growth_clients.png)\n")
    with open(os.path.join(results, "growth.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
