#!/usr/bin/env python3
"""The outbox section of make bench: outbox.md from tests/bench/outbox.sh's CSVs.

usage: outbox_report.py CELLS.csv LIFE.csv MACHINE.txt [OUT.md]

With OUT.md, writes the page there and prints the targets as a pass/fail
table; without, prints the page.  tests/bench/report.py imports load() and
targets() to put the outbox targets in make bench's targets table too.
"""
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
from why import why  # noqa: E402  (tests/bench/why.py: the measured causes of misses)

CELLS = [
    ("stage1", "stage, 1 event per transaction (4 clients)"),
    ("stage100", "stage, 100 events per transaction (4 clients)"),
    ("drain1", "claim + ack, batch 1 (4 drainers, seeded backlog)"),
    ("drain100", "claim + ack, batch 100 (4 drainers, seeded backlog)"),
    ("mixed", "2 producers (1/txn) + 2 drainers (batch 10), from empty: consumed"),
    ("solo1", "claim + ack, batch 1, 1 drainer, synchronous_commit = off"),
    ("solo100", "claim + ack, batch 100, 1 drainer, synchronous_commit = off"),
]
TITLE = dict(CELLS)
# Issue 13: the cells measured against pgmq, each >= 1.0 x the floor's.
TARGET_CELLS = [("stage1", "stage 1 per transaction"), ("stage100", "stage 100 per transaction"),
                ("drain1", "claim+ack 1"), ("drain100", "claim+ack 100"),
                ("mixed", "2 producers + 2 drainers from empty")]
CELL_VS_FLOOR, WAL_VS_FLOOR, SIZE_VS_FLOOR = 1.0, 1.2, 2.0
# Issue 23: against pgmq itself (when PGMQ_SQL named it): every cell
# >= 1.1 x pgmq's events/s and WAL per consumed event <= 1.0 x pgmq's, both
# with the archive off (pgmq's delete keeps nothing either); the archive's
# WAL <= 1.3 x pgmq's.
CELL_VS_PGMQ, WAL_VS_PGMQ, ARCHIVE_WAL_VS_PGMQ = 1.1, 1.0, 1.3
# Issue 35: the batch cells >= 1.1 x pgmq with the archive on too (the
# default), judged on their own rows.
ARCHIVE_CELLS_VS_PGMQ = ("stage100", "drain100")
# The variant the targets judge: published events not retained, as the
# floor (which deletes at the ack) does not retain them.  The archive's
# cost (the default, idem.outbox_archive = on) is stated beside them.
JUDGED, RETAINED = "pg_idem_noarch", "pg_idem"
VARIANTS = ["pg_idem", "pg_idem_noarch", "sql_edition", "floor", "pgmq"]
LABEL = {"pg_idem": "pg_idem (archive)", "pg_idem_noarch": "pg_idem (no archive)",
         "sql_edition": "SQL edition (archive)", "floor": "floor (pgmq's shape)", "pgmq": "pgmq"}


def load(cells_path, life_path):
    """Events/s and server CPU per event of every (cell, variant) round, and
    the life rows."""
    rates, cpu, loads = {}, {}, []
    with open(cells_path) as f:
        for row in csv.DictReader(f):
            key = (row["cell"], row["variant"])
            rates.setdefault(key, []).append(float(row["events_per_s"]))
            loads.append(float(row["load"]))
            # cpu_s: from outbox.sh runs that measure it (older CSVs lack it).
            if row.get("cpu_s") and int(row["events"]) > 0:
                cpu.setdefault(key, []).append(float(row["cpu_s"]) * 1e6 / int(row["events"]))
    life = list(csv.DictReader(open(life_path)))
    # outbox.sh's WAL records by type, beside the life CSV (older runs lack it;
    # the main section's wal_records.csv is another file).
    records_path = os.path.join(os.path.dirname(os.path.abspath(life_path)),
                                "outbox_wal_records.csv")
    records = list(csv.DictReader(open(records_path))) if os.path.exists(records_path) else []
    return {"rates": rates, "med": {k: statistics.median(v) for k, v in rates.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "loads": loads,
            "life": {r["variant"]: r for r in life}, "life_rows": life, "records": records}


# What each WAL record of an event's life is for.
RECORD_WHY = {
    "Heap/INSERT": "the row (the staged event; pg_idem's claim: the event moved into idem_outbox_claimed)",
    "Heap/INSERT+INIT": "the same, first row of a new page",
    "Heap/UPDATE": "a new row version with new index entries (pgmq: read's; pg_idem: the ack's, "
                   "a nack's or a re-claim's, which carries the changed bytes only when it stays "
                   "on the row's page)",
    "Heap/UPDATE+INIT": "the same, into a new page",
    "Heap/HOT_UPDATE": "a new row version with no index change",
    "Heap/LOCK": "a row lock (FOR UPDATE), and the old version's mark before an update "
                 "moves the row to another page",
    "Heap/DELETE": "a removal of the row: pg_idem's claim from the queue, the ack with the archive off (pgmq: delete's)",
    "Heap2/PRUNE": "page pruning of dead versions",
    "Btree/INSERT_LEAF": "an index entry (primary key, claimable or vt index; an ack's new primary key entry)",
    "Btree/INSERT_UPPER": "an index page split's parent entry",
    "Btree/SPLIT_L": "an index page split", "Btree/SPLIT_R": "an index page split",
    "Btree/DEDUP": "index deduplication", "Btree/NEWROOT": "a new index root",
    "Btree/DELETE": "index entries of dead rows removed",
    "BRIN/SAMEPAGE_UPDATE": "idem_outbox_claimed's published_at summary",
    "Transaction/COMMIT": "the commits", "Sequence/LOG": "the id sequence (one per 32 ids)",
}


def _ratio(a, b):
    return a / b if a is not None and b else None


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _per_event(r, field):
    return int(r[field]) / int(r["events"]) if r and int(r["events"]) else None


def _size(r):
    return int(r["queue_bytes"]) + int(r["archive_bytes"]) if r else None


def targets(d):
    """Issue 13's outbox targets: dicts of key, name, measured, ok (None
    when not measured) and, for a missed one, gap (by how much, and the
    placeholder for why)."""
    med, cpu, life = d["med"], d["cpu"], d["life"]
    out = []
    for cell, short in TARGET_CELLS:
        floor = med.get((cell, "floor"))
        r = _ratio(med.get((cell, JUDGED)), floor)
        ra = _ratio(med.get((cell, RETAINED)), floor)
        a, b = cpu.get((cell, JUDGED)), cpu.get((cell, "floor"))
        t = {"key": "outbox_" + cell,
             "name": f"outbox {short} ≥ {CELL_VS_FLOOR:g} × bare queue floor (events/s, "
                     "archive off)",
             # The floor's CPU per event over pg_idem's: what a CPU-bound
             # server's ratio would be, much less moved by other load.
             "measured": f"{_f(r)}; from server CPU per event {_f(_ratio(b, a))}; with the "
                         f"archive (the default) {_f(ra)}",
             "ok": None if r is None else r >= CELL_VS_FLOOR}
        if t["ok"] is False:
            t["gap"] = (f"**{t['name']}**: {r:.2f} ×, short by "
                        f"{100 * (1 - r / CELL_VS_FLOOR):.0f} % ({med[(cell, JUDGED)]:.0f} "
                        f"events/s against {floor:.0f})" +
                        (f"; server CPU per event {a:.1f} µs against the floor's {b:.1f} µs "
                         f"({a - b:+.1f} µs; {CELL_VS_FLOOR:g} × by CPU is ≤ "
                         f"{b / CELL_VS_FLOOR:.1f} µs)" if a and b else "") + ". " + why(t["key"]))
        out.append(t)
    j, fl = life.get(JUDGED), life.get("floor")
    w, wf = _per_event(j, "wal_total"), _per_event(fl, "wal_total")
    r = _ratio(w, wf)
    t = {"key": "outbox_wal",
         "name": f"outbox WAL per consumed event ≤ {WAL_VS_FLOOR:g} × floor (stage to ack, "
                 "archive off)",
         "measured": (f"{_f(r)} ({_f(w, '.0f')} B against {_f(wf, '.0f')} B; the drain alone "
                      f"{_f(_per_event(j, 'wal_drain'), '.0f')} B against "
                      f"{_f(_per_event(fl, 'wal_drain'), '.0f')} B)"),
         "ok": None if r is None else r <= WAL_VS_FLOOR}
    if t["ok"] is False:
        t["gap"] = (f"**{t['name']}**: {r:.2f} ×, over the bound by "
                    f"{100 * (r / WAL_VS_FLOOR - 1):.0f} %: ≤ {WAL_VS_FLOOR:g} × is "
                    f"≤ {WAL_VS_FLOOR * wf:.0f} B per event, {w - WAL_VS_FLOOR * wf:.0f} B less "
                    "than now. " + why(t["key"]))
    out.append(t)
    sz, szf = _size(j), _size(fl)
    r = _ratio(sz, szf)
    t = {"key": "outbox_size",
         "name": f"outbox size after consuming + VACUUM ≤ {SIZE_VS_FLOOR:g} × floor "
                 "(archive off)",
         "measured": (f"{_f(r)} ({_f(sz and sz / 1048576)} MiB against "
                      f"{_f(szf and szf / 1048576)} MiB, {j['events'] if j else '-'} events)"),
         "ok": None if r is None else r <= SIZE_VS_FLOOR}
    if t["ok"] is False:
        t["gap"] = (f"**{t['name']}**: {r:.2f} ×, over the bound by "
                    f"{100 * (r / SIZE_VS_FLOOR - 1):.0f} % ({sz - SIZE_VS_FLOOR * szf:.0f} B "
                    "too many). " + why(t["key"]))
    out.append(t)
    return out + pgmq_targets(d)


def pgmq_targets(d):
    """Issue 23's targets against pgmq run beside pg_idem; none without pgmq."""
    med, cpu, life = d["med"], d["cpu"], d["life"]
    if not any(k[1] == "pgmq" for k in med):
        return []
    out = []
    for cell, short in TARGET_CELLS:
        base = med.get((cell, "pgmq"))
        r = _ratio(med.get((cell, JUDGED)), base)
        ra = _ratio(med.get((cell, RETAINED)), base)
        a, b = cpu.get((cell, JUDGED)), cpu.get((cell, "pgmq"))
        t = {"key": "outbox_pgmq_" + cell,
             "name": f"outbox {short} ≥ {CELL_VS_PGMQ:g} × pgmq (events/s, archive off)",
             "measured": f"{_f(r)}; from server CPU per event {_f(_ratio(b, a))}; with the "
                         f"archive (the default) {_f(ra)}",
             "ok": None if r is None else r >= CELL_VS_PGMQ}
        if t["ok"] is False:
            t["gap"] = (f"**{t['name']}**: {r:.2f} ×, short by "
                        f"{100 * (1 - r / CELL_VS_PGMQ):.0f} % ({med[(cell, JUDGED)]:.0f} "
                        f"events/s against pgmq's {base:.0f})" +
                        (f"; server CPU per event {a:.1f} µs against pgmq's {b:.1f} µs"
                         if a and b else "") + ". " + why(t["key"]))
        out.append(t)
        if cell in ARCHIVE_CELLS_VS_PGMQ:
            out.append(_archive_cell_target(cell, short, med, cpu))
    q = life.get("pgmq")
    wq = _per_event(q, "wal_total")
    for key, variant, bound, what in (
            ("outbox_pgmq_wal", JUDGED, WAL_VS_PGMQ, "archive off"),
            ("outbox_pgmq_archive_wal", RETAINED, ARCHIVE_WAL_VS_PGMQ,
             "archive on, the default")):
        w = _per_event(life.get(variant), "wal_total")
        r = _ratio(w, wq)
        t = {"key": key,
             "name": f"outbox WAL per consumed event ≤ {bound:g} × pgmq's (stage to ack, {what})",
             "measured": (f"{_f(r)} ({_f(w, '.0f')} B against {_f(wq, '.0f')} B; the drain "
                          f"alone {_f(_per_event(life.get(variant), 'wal_drain'), '.0f')} B "
                          f"against {_f(_per_event(q, 'wal_drain'), '.0f')} B)"),
             "ok": None if r is None else r <= bound}
        if t["ok"] is False:
            t["gap"] = (f"**{t['name']}**: {r:.2f} ×, {w - bound * wq:.0f} B per event over. " +
                        why(t["key"]))
        out.append(t)
    return out


def _archive_cell_target(cell, short, med, cpu):
    """A batch cell against pgmq with the archive on (issue 35)."""
    base, ours = med.get((cell, "pgmq")), med.get((cell, RETAINED))
    r = _ratio(ours, base)
    a, b = cpu.get((cell, RETAINED)), cpu.get((cell, "pgmq"))
    t = {"key": "outbox_pgmq_archive_" + cell,
         "name": f"outbox {short} ≥ {CELL_VS_PGMQ:g} × pgmq (events/s, archive on, the "
                 "default)",
         "measured": f"{_f(r)}; from server CPU per event {_f(_ratio(b, a))}",
         "ok": None if r is None else r >= CELL_VS_PGMQ}
    if t["ok"] is False:
        t["gap"] = (f"**{t['name']}**: {r:.2f} ×, short by "
                    f"{100 * (1 - r / CELL_VS_PGMQ):.0f} % ({ours:.0f} events/s against "
                    f"pgmq's {base:.0f})" +
                    (f"; server CPU per event {a:.1f} µs against pgmq's {b:.1f} µs"
                     if a and b else "") + ". " + why(t["key"]))
    return t


def retention_cost(d):
    """What keeping published events (the archive, the default) costs,
    against idem.outbox_archive = off: one sentence, from this run."""
    med, life = d["med"], d["life"]
    a, n = life.get(RETAINED), life.get(JUDGED)
    parts = []
    if a and n:
        e = int(a["events"])
        parts.append(f"{(int(a['wal_total']) - int(n['wal_total'])) / e:+.0f} B of WAL per event "
                     f"({int(a['wal_total']) / e:.0f} B against {int(n['wal_total']) / e:.0f} B)"
                     f" and an archive of {int(a['archive_bytes']) / 1048576:.2f} MiB after "
                     f"VACUUM ({int(a['archive_bytes']) / e:.0f} B per event over {e} events)")
    rs = [(short, _ratio(med.get((cell, RETAINED)), med.get((cell, JUDGED))))
          for cell, short in TARGET_CELLS]
    if any(r is not None for _, r in rs):
        parts.append("throughput with the archive / without: " +
                     ", ".join(f"{short} {_f(r)}" for short, r in rs))
    if not parts:
        return ""
    return ("Retention (`idem.outbox_archive = on`, the default, against off) costs " +
            "; ".join(parts) + ".")


def page(d, machine):
    rates, med, cpu, loads = d["rates"], d["med"], d["cpu"], d["loads"]
    present = [v for v in VARIANTS if any(k[1] == v for k in rates)]
    out = []
    out.append("# Outbox benchmarks: pg_idem against a bare queue floor and pgmq\n")
    out.append("Generated by `tests/bench/outbox.sh` (part of `make bench`); %s, %s mode, "
               "%s rounds of %s s per cell, variants interleaved and rotated per round; "
               "medians of the rounds.  %s.  Machine: %s cores, load %.1f .. %.1f during the "
               "cells (shared with other work: read the ratios, not the absolute numbers).  "
               "pgmq: %s.\n" % (machine.get("date"), machine.get("mode"), machine.get("rounds"),
                                machine.get("secs"), machine.get("postgres", "").split(" on ")[0],
                                machine.get("nproc"), min(loads), max(loads), machine.get("pgmq")))

    ts = targets(d)
    out.append("## Targets (issues 13 and 23)\n")
    out.append("*Archive off* is `idem.outbox_archive = off`: like the floor, which deletes an "
               "event at its ack, pg_idem then keeps no published event (the issue's "
               "`idem.outbox_retention = 0`; that setting's least value is 1 s).\n")
    out.append("| target | measured | result |")
    out.append("|---|---|---|")
    for t in ts:
        out.append("| %s | %s | %s |" % (t["name"], t["measured"], verdict(t["ok"])))
    cost = retention_cost(d)
    if cost:
        out.append("\n" + cost)
    gaps = [t["gap"] for t in ts if t.get("gap")]
    if gaps:
        out.append("\n### Missed targets: by how much\n")
        out.extend("- " + g for g in gaps)
    out.append("")

    out.append("## Events per second\n")
    head = "| cell | " + " | ".join(LABEL[v] for v in present) + " | pg_idem / floor | no archive / floor |"
    if "pgmq" in present:
        head += " pg_idem / pgmq |"
    out.append(head)
    out.append("|" + "---|" * (head.count("|") - 1))
    for cell, title in CELLS:
        if not any((cell, v) in med for v in present):
            continue
        row = ["%s" % title]
        for v in present:
            r = med.get((cell, v))
            row.append("%.0f" % r if r is not None else "")
        floor = med.get((cell, "floor"))

        def ratio(v, base):
            a = med.get((cell, v))
            return "%.2f" % (a / base) if a and base else ""
        row.append(ratio("pg_idem", floor))
        row.append(ratio("pg_idem_noarch", floor))
        if "pgmq" in present:
            row.append(ratio("pg_idem", med.get((cell, "pgmq"))))
        out.append("| " + " | ".join(row) + " |")
    out.append("\nEvents per second.  Spread of the rounds (min .. max), per cell and variant: " +
               "; ".join("%s/%s %.0f..%.0f" % (c, v, min(r), max(r))
                         for (c, v), r in sorted(rates.items())) + ".\n")
    if cpu:
        out.append("Server CPU per event (µs; the backends' CPU time over the cell, as the "
                   "postmaster accounts its exited children, divided by the events; in the "
                   "mixed cell the producers' too, over the events consumed):\n")
        out.append("| cell | " + " | ".join(LABEL[v] for v in present) + " |")
        out.append("|" + "---|" * (len(present) + 1))
        for cell, title in CELLS:
            if any((cell, v) in cpu for v in present):
                out.append("| %s | %s |" % (title, " | ".join(_f(cpu.get((cell, v)), ".1f")
                                                            for v in present)))
        out.append("")

    life = d["life_rows"]
    if life:
        out.append("## One event's life: WAL and size\n")
        n = life[0]["events"]
        out.append("One client stages %s events (100 per transaction) and drains them (claim + ack "
                   "by 100) after a CHECKPOINT; then `VACUUM` of the queue (and the archive).\n" % n)
        out.append("| variant | WAL per event, stage to ack | WAL per consumed event (drain) | "
                   "queue after VACUUM | archive after VACUUM |")
        out.append("|---|---|---|---|---|")
        for r in life:
            e = int(r["events"])
            out.append("| %s | %.0f B | %.0f B | %.2f MiB | %.2f MiB |" % (
                LABEL[r["variant"]], int(r["wal_total"]) / e, int(r["wal_drain"]) / e,
                int(r["queue_bytes"]) / 1048576, int(r["archive_bytes"]) / 1048576))
        base = next((r for r in life if r["variant"] == "floor"), None)
        if base:
            out.append("")
            for r in life:
                if r["variant"].startswith("pg_idem"):
                    out.append("- %s / floor: WAL per event %.2f (drain alone %.2f), queue size %.2f." % (
                        LABEL[r["variant"]], int(r["wal_total"]) / int(base["wal_total"]),
                        int(r["wal_drain"]) / int(base["wal_drain"]),
                        int(r["queue_bytes"]) / max(int(base["queue_bytes"]), 1)))
        out.append("")
    recs = d.get("records") or []
    if recs and life:
        events = {r["variant"]: int(r["events"]) for r in life}
        have = [v for v in VARIANTS if any(r["variant"] == v for r in recs)]
        out.append("## WAL by record type\n")
        out.append("The same life, by `pg_waldump --stats=record` between the steps' LSNs: bytes "
                   "per event of each record type (full-page images included), the staging "
                   "and the drain apart.\n")
        out.append("| step | record | " + " | ".join(LABEL[v] for v in have) + " | what it is |")
        out.append("|" + "---|" * (len(have) + 3))
        for step in ("stage", "drain"):
            types = sorted({r["record"] for r in recs if r["step"] == step})
            per = {(r["variant"], r["record"]): int(r["bytes"]) / events[r["variant"]]
                   for r in recs if r["step"] == step}
            for t in types:
                if max(per.get((v, t), 0) for v in have) < 1:
                    continue
                out.append("| %s | %s | %s | %s |" % (step, t, " | ".join(
                    "%.0f" % per[(v, t)] if (v, t) in per else "" for v in have),
                    RECORD_WHY.get(t, "")))
            out.append("| %s | **total** | %s | |" % (step, " | ".join(
                "**%.0f**" % sum(b for (v2, _), b in per.items() if v2 == v) for v in have)))
        out.append("")
    return "\n".join(out)


def verdict(ok):
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def main():
    cells_path, life_path, machine_path = sys.argv[1:4]
    d = load(cells_path, life_path)
    machine = dict(line.rstrip("\n").split("=", 1) for line in open(machine_path) if "=" in line)
    text = page(d, machine)
    if len(sys.argv) < 5:
        print(text)
        return
    with open(sys.argv[4], "w") as f:
        f.write(text + "\n")
    ts = targets(d)
    width = max(len(t["name"]) for t in ts)
    print()
    print(f"{'target':<{width}}  result  measured")
    for t in ts:
        print(f"{t['name']:<{width}}  {verdict(t['ok']):<6}  {t['measured']}")
    cost = retention_cost(d)
    if cost:
        print(cost)
    print()
    print(f"outbox results: {sys.argv[4]}")


if __name__ == "__main__":
    main()
