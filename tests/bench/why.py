"""Why a target of issue 13 is missed, as measured: what the measurement of
the cause found and what would close the gap, keyed by the target.  The
run's own numbers (by how much, CPU per request, WAL by record type) are
printed beside each; report.py and outbox_report.py use this text for a
target this run missed.  A miss with no entry here says so."""

WHY = {
    "wal_minimal": (
        "The difference is the speculative insertion's confirm record (`Heap/HEAP_CONFIRM`, "
        "48 B per new key) and the generation sequence's WAL (`Sequence/LOG`, one 99 B record "
        "per 32 claims, about 3 B per request), measured with `pg_waldump --stats=record` over "
        "1000 cycles: the heap and B-tree records are the floor's, byte for byte. The confirm "
        "record is what makes a new key's insert race-safe in one statement: a concurrent "
        "insert of the same key waits, then inserts nothing (ON CONFLICT DO NOTHING), where "
        "the floor's bare `INSERT` would fail with a unique violation. What would close it: a "
        "per-key heavyweight lock around a plain insert instead. Not done: every new key "
        "would take a shared lock-table entry (a partition LWLock round trip per claim), and "
        "an insert by anything that does not take that lock (an admin's, a restore's) would "
        "turn a concurrent claim into a unique-violation error."),
}

NOT_EXPLAINED = "*No measurement of this miss's cause has been recorded (tests/bench/why.py).*"


def why(key):
    return WHY.get(key, NOT_EXPLAINED)
