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
    "replay_minimal": (
        "A replay is about 3 µs of server CPU over a bare SELECT's 11. A perf profile of a "
        "1-client replay run (`perf record` on the backend) puts the pg_idem call itself at "
        "10.2 % of the backend's time, 8.0 of it the primary-key probe that the bare SELECT "
        "makes too; the rest of the difference is the FunctionScan around it "
        "(`ExecInitFunctionScan` 5.9 %, the one-row tuplestore of `ExecMakeTableFunctionResult` "
        "2.2 %), which is what `SELECT * FROM f(...)` costs in PostgreSQL for any function, and "
        "the call's own fresh snapshot (a volatile function reads the latest commit, the bare "
        "SELECT reuses its statement's). The ratio moves from run to run: 0.85, 0.87, 0.71, "
        "0.93 and 0.81 × in today's five runs, and 0.97-1.07 × in single-session interleaved "
        "runs. Calling it as `SELECT idem_claim(...)` (no FunctionScan) measured the same as "
        "the FROM form. What would close it: reading with the statement's snapshot instead of "
        "a fresh one (a semantic change: a commit between the statement's start and the read "
        "would be missed), or a FunctionScan that does not materialise a non-set function's "
        "one row (PostgreSQL)."),
    "cycle_minimal_headline": (
        "Measured piece by piece in the cycle section above (server CPU per request, 1 client, "
        "sync off, probes paired round by round): the race-safe insert (floor + ON CONFLICT "
        "against floor) and the in-transaction trigger (pg_idem against pg_idem without it) "
        "are the two costs the minimal floor does not pay; both are semantics the issue keeps "
        "(one-statement race safety, the deferred constraint trigger). The function layer "
        "itself (pg_idem without its trigger against floor + ON CONFLICT) is below the floor's "
        "cost. The 4-client cell's throughput ratio moves by more than the gap from run to "
        "run: 1.00, 1.11, 0.91 and 0.94 × in today's four runs of `make bench` (three quick, "
        "one medium). What would close it: "
        "dropping the in-transaction trigger for lease-mode claims (a trigger cannot be "
        "skipped per row without its WHEN evaluation and the old row's fetch), e.g. a "
        "separate table for idem_begin's claims."),
    "cycle_plpgsql_headline": (
        "By server CPU per request the headline cell is 1.37–1.52 × PL/pgSQL (0.6.0's two "
        "quiet medium runs, 169b036 and c1893f2): pg_idem runs the protocol without an "
        "executor per statement, where PL/pgSQL runs each through SPI (results.md's cycle "
        "section, probes paired round by round). With `synchronous_commit = on` both "
        "variants wait for two WAL flushes per request, a time neither controls, so the "
        "throughput ratio is pulled towards 1: with commits not waiting (sync off) the same "
        "runs measured 1.27 and 1.59 × at 4 clients, 1.34 and 1.72 × at 1 and 1.64 and "
        "1.43 × at 16. What would close it by throughput: nothing on the CPU side is left to "
        "PL/pgSQL's share; the two commits are the lease protocol's (in-transaction mode "
        "has one)."),
    "renew_minimal": (
        "A renew is one primary-key update of a pending key's lease either way, HOT on both "
        "tables; pg_idem's is `SELECT idem_renew(...)`, a function call that finds the key, "
        "checks the caller's claim id against the row (the bare UPDATE checks nothing) and "
        "updates the lease in place. At 4 clients with `synchronous_commit = on` every "
        "request waits for a WAL flush and the cell's rounds spread by 30–50 %: 1.04 × in "
        "0.6.0's first quiet medium run (169b036), 0.84 × in the second (c1893f2), whose "
        "rounds gave 0.84, 0.84 and 0.96 × and whose CPU difference paired by round was not "
        "resolved (+18 ± 19 µs). An interleaved probe without flushes on that run's kept "
        "cluster (1 client, `synchronous_commit = off`, 4 rounds of 5 s of the same pgbench "
        "scripts) gave 0.95, 0.87, 0.88 and 1.10 × (median 0.92): about 4 µs per request "
        "over the bare UPDATE's 62, the function call and its owner check; idem_keys' "
        "in-transaction trigger disabled changed nothing measurable (0.95–1.08 × pg_idem "
        "with it). What would close it: nothing that keeps the owner check; a renew that "
        "did not compare the claim id would let a stale winner extend a lease it lost."),
    "cleanup_pacing": (
        "The cause of the earlier misses at 10 M keys was measured and removed: the "
        "cleanup wrote each key it picked through a primary-key probe, a random leaf of an "
        "index larger than shared_buffers (512 MB in growth.sh). On 27fbe1d (3 rounds at "
        "200 ms, growth.sh's pacing_buffers.csv) the paced phases read 64–76 k blocks "
        "against the quiet phases' 40–53 k, sessions wrote out 3.6–7.9 k dirty buffers to "
        "get free ones (none when quiet), and the ratio was 1.89, 1.31 and 1.54 ×; the same "
        "run with shared_buffers 8 GB, which holds table and index, gave 2.09 (its cold "
        "first round), 1.11 and 1.14 ×. Writing the picked rows by TID (9c11b56) made the "
        "paced phases read what the quiet ones read (47–55 k against 47–56 k blocks) and "
        "gave 0.89, 1.23 and 1.12 × at 4.6 k keys/s. Where this run still misses, the "
        "pacing table's blocks read and backend writes say whether the cleanup made the "
        "server read more than the claims alone; the rest of the ratio's spread from run "
        "to run (1.20–1.77 × at 10 M keys over the probing cleanup's runs) is the quiet p99 "
        "it is divided by (docs/benchmarks.md)."),
    "outbox_stage1": (
        "Staging is a direct insert now (no executor per event; `direct_table.c`); by server "
        "CPU per event it is within 2 µs (4 %) of the floor's bare `INSERT`, and the "
        "throughput cells of one run move by more (0.90, 1.02 and 0.97 × in today's three runs "
        "since staging went direct). "
        "What is left is the function call around the insert (argument checks, the topic, "
        "the scope, the wake-up registration) and the queue's wider row (16 columns against "
        "the floor's 5) with two indexes to maintain (primary key and the claimable partial "
        "index) against the floor's two."),
    "outbox_mixed": (
        "2 producers + 2 drainers: by server CPU per event pg_idem is within 1.5 % of the "
        "floor (the stage side as for `outbox_stage1`; the drain side passes its own "
        "targets). The throughput gap is within the run-to-run spread: 1.04, 0.85 and 0.94 × "
        "in today's three runs since staging went direct."),
    "outbox_stage100": (
        "By instruction count (callgrind, results/outbox_instructions.md, 2000 events staged "
        "by 100): 29.3 k instructions per event, of which the two B-tree inserts (primary key "
        "and the claimable index) are 16.2 k, the heap insert 4.0 k, forming the row 2.6 k and "
        "the id's nextval 2.5 k: the work the floor's INSERT ... SELECT does too, with a wider "
        "row (16 columns against 5) and a three-column claimable index (scope, available_at, "
        "id) against the floor's vt. What is pg_idem's own, the call and its checks, is under "
        "1 k per event. The throughput ratio of this cell moves by more than the gap: 1.05 "
        "and 0.95 x in two runs today, its rounds spreading over 30 % (see the spread line)."),
    "outbox_drain100": (
        "By instruction count (callgrind, 2000 events claimed and acked by 100, archive off): "
        "69.5 k instructions per event: the claim 52 k (its lease a non-HOT update, 41 k, two "
        "B-tree inserts of it 24.8 k; the row lock 7 k) and the ack's delete 15 k: the floor's "
        "work, one for one (FOR UPDATE SKIP LOCKED, an update of an indexed column, a "
        "delete), on the wider row and index of `outbox_stage100`: 3 % short in both of "
        "today's runs (0.97 x). What would close it: a narrower queue row and claimable "
        "index (see `outbox_pgmq_stage100`)."),
    # Issue 23's cells against pgmq.  A throughput miss of a cell that commits
    # once per event or batch on both sides, with the instruction count's
    # ratio passing, is the disk's: the same commits, the same fsyncs.
    "outbox_pgmq_stage1": (
        "One event per transaction: pg_idem and pgmq commit, and wait for the WAL flush, "
        "once per event, so on a disk whose fsync dominates (this machine's, shared with "
        "other work) both run at the commit rate and their ratio is about 1 whatever the "
        "statements cost. By server instructions per event (callgrind, "
        "results/outbox_instructions.md) pg_idem's stage is about a quarter of pgmq's "
        "(pgmq.send is PL/pgSQL around a dynamic INSERT)."),
    "outbox_pgmq_stage100": (
        "Measured by instruction count (callgrind, results/outbox_instructions.md): per event "
        "staged by 100 both do the same work, one heap insert and two B-tree inserts, and the "
        "two B-tree inserts are half of pg_idem's cost (`index_insert`, about 15 k "
        "instructions per event). The rest of the difference is pg_idem's wider row (16 "
        "columns against pgmq's 6), its claimable index's three columns (scope, available_at, "
        "id) against pgmq's one (vt), and the two partial indexes' predicates checked per "
        "insert. What would close it: a narrower queue row and index (the scope in the "
        "claimable index is what keeps one role's drainers off another's events)."),
    "outbox_pgmq_wal": (
        "By record type (the page's WAL table, pg_waldump): the records are pgmq's, one for "
        "one (the claim's row lock, Heap/LOCK, is pgmq's FOR UPDATE); the excess is the row's width (about 30 B more per heap record: topic, state, "
        "attempts, scope, created_at, and the claim token once leased) and the claimable "
        "index's three columns (about 8 B per entry). A lease that stays on its page (the "
        "queue at fillfactor 40) measured about 0.8 ×, but cost staging by 4 clients 43 % of its "
        "throughput on PostgreSQL 15 (docs/benchmarks.md#the-outbox), so the default keeps "
        "fillfactor 100."),
    "outbox_pgmq_archive_wal": (
        "The archive keeps each event in idem_outbox_claimed (issue 35's design): a claim moves "
        "it there (the queue row's delete, a small record, and the whole row inserted, about "
        "420 B of Heap/INSERT with its first-row-of-a-page records, and its primary-key and "
        "claimable entries: what pgmq's read writes for its new version), and the ack marks it "
        "published on its page, whose free half (fillfactor 50) keeps the update there: about "
        "130 B of Heap/UPDATE, the changed bytes only, plus a new primary-key entry (64 B; the "
        "update is not HOT: the claimable index's predicate names the state, and on "
        "PostgreSQL 15 the BRIN on published_at counts too), by the page's WAL table. "
        "Measured 1.22 × pgmq's WAL in 0.6.0's run of the design (plain SQL: 1.18 ×, "
        "results/outbox_archive_designs.md), against 1.51 × for the archive table's copy "
        "before it. `idem.outbox_archive = off` keeps nothing, as pgmq's delete."),
    "outbox_pgmq_drain1": (
        "Claim and ack of one event are two transactions, each a commit and a WAL flush on "
        "both sides: commit-bound on this machine's disk, as for `outbox_pgmq_stage1`. By "
        "server instructions per event pg_idem's claim + ack is about a quarter of pgmq's "
        "(results/outbox_instructions.md)."),
    "outbox_pgmq_drain100": (
        "By server instructions per event (results/outbox_instructions.md) pg_idem's claim + "
        "ack of 100 is about 1.4 × faster than pgmq's read + delete with the archive off, and "
        "about 1.1 × with it; a throughput miss in the same run is the shared machine's "
        "(the cells' rounds spread by more than the gap: see the spread line)."),
    "outbox_pgmq_archive_stage100": (
        "Staging does the same work with the archive on or off (the setting only changes "
        "what an ack does), so this cell's archive-on and archive-off rows are two samples "
        "of one workload: 1.05 × and 1.00 × pgmq in 0.6.0's quiet run, both at pgmq's server "
        "CPU per event (14.8 against 14.8 and 15.2 µs). The cause is `outbox_pgmq_stage100`'s: "
        "the same heap insert and two B-tree inserts as pgmq on a wider row and index."),
    "outbox_pgmq_archive_drain100": (
        "With the archive on each event is written once more than with it off: the claim "
        "moves it into idem_outbox_claimed (an insert of the row and two index entries, where "
        "the archive-off claim updates it in the queue) and the ack updates it there (a "
        "same-page update and a new primary-key entry, where the archive-off ack deletes it). "
        "By instruction count (callgrind, results/outbox_instructions.md, by 100): 88.5 k per "
        "event against 70.5 k with the archive off and pgmq's 91.8 k, 1.04 × pgmq; the archive "
        "table's copy cost the same (87.6 k before the move): the design moved that work from "
        "the ack to the claim and bought WAL (`outbox_pgmq_archive_wal`), not instructions. "
        "In 0.6.0's run of it: 1.03 × pgmq by throughput, 1.06 × by server CPU. What would "
        "close it: an ack that is a HOT update (no new index entry: the state out of the "
        "claimable index's predicate, which would then keep published events in the claim's "
        "scan), or a claim that leases without a copy of the event."),
    "outbox_pgmq_mixed": (
        "Producers commit per event and drainers per batch on both sides: commit-bound on "
        "this machine's disk, as for `outbox_pgmq_stage1`; the statements' own cost is in "
        "results/outbox_instructions.md."),
}

NOT_EXPLAINED = "*No measurement of this miss's cause has been recorded (tests/bench/why.py).*"


def why(key):
    return WHY.get(key, NOT_EXPLAINED)
