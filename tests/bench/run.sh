#!/usr/bin/env bash
# make bench [MODE=quick|medium|full]: pg_idem against four baselines, on a
# throwaway cluster of its own, every scenario against every variant in one
# run, interleaved; writes tests/bench/results/ (results.md, PNG plots, raw
# CSV) and prints the targets as a pass/fail table.
#
#   quick   2 rounds x 1 s per cell, 16 s steady state, idem.ttl 2 s   (about 3 minutes,
#           5 with the outbox section)
#   medium  3 rounds x 3 s per cell, otherwise as quick (about an hour with the
#           outbox and growth sections, the cleanup's pacing at 1 M and 10 M
#           keys): steadier ratios than quick's 1-second cells
#   full    5 rounds x 20 s per cell, 250 s steady states, idem.ttl 20 s (about 2 hours,
#           from the cell count; the outbox section after it)
#
# Variants (tests/bench/sql/setup.sql, tests/bench/scripts/*.sql), each on
# its own table shaped exactly like idem_keys, but for minimal's:
#   minimal   the floor's bare statements on a minimal table (idem_keys'
#             columns and primary key only: no CHECKs, no trigger,
#             fillfactor 70), the base of issue 13's targets
#   floor     a bare INSERT of the pending row and a bare UPDATE by key
#   cte       the claim CTE of a service's hand-written design (the seed pg_idem
#             replaces) sent as client SQL, owner-scoped UPDATE
#   plpgsql   pg_idem's protocol written as PL/pgSQL functions
#   pg_idem   idem_claim / idem_finalize (and idem_begin, idem_renew, ...)
#   sql_edition  the same calls to the SQL edition (extension/sql_edition/,
#             the plain script), in a database of its own on the same
#             cluster (bench_sql, search_path idem): the claim cycle and the
#             replay only; results/sql_edition.md (sql_edition_report.py)
#
# A cell is one (scenario, variant, clients, synchronous_commit) point.  A
# round runs every cell once, for SECS seconds each; the variants of one
# scenario run back to back, in an order that rotates from round to round,
# so that the machine's drift (other engineers share it) hits all alike.
# Before each run the cell's table is emptied, and seeded where the scenario
# needs rows.  A seeded run starts right after a CHECKPOINT, so that its
# full-page images are those of a checkpoint's first seconds (an emptied
# table's pages are all new and never need one); full mode checkpoints
# before every run, quick mode never reaches a checkpoint otherwise.
# $WORK is removed at the end unless BENCH_KEEP=1.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tests/bench
RESULTS=$BENCH/results
. "$ROOT/tests/lib.sh"

MODE=${1:-quick}
case $MODE in
    quick) ROUNDS=2 SECS=1 FSYNC_SECS=1 WAKE_ROUNDS=10 CYCLE_ROUNDS=3 CYCLE_SECS=1
           STEADY_WARMUP=3 STEADY_PHASE=3 STEADY_RECOVERY=7 STEADY_TTL=2s ;;
    medium) ROUNDS=3 SECS=3 FSYNC_SECS=1 WAKE_ROUNDS=50 CYCLE_ROUNDS=3 CYCLE_SECS=3
           STEADY_WARMUP=3 STEADY_PHASE=3 STEADY_RECOVERY=7 STEADY_TTL=2s ;;
    full)  ROUNDS=5 SECS=20 FSYNC_SECS=2 WAKE_ROUNDS=200 CYCLE_ROUNDS=5 CYCLE_SECS=10
           STEADY_WARMUP=40 STEADY_PHASE=60 STEADY_RECOVERY=90 STEADY_TTL=20s ;;
    *) echo "usage: make bench [MODE=quick|medium|full]" >&2; exit 2 ;;
esac
# Steady state: requests per second offered by 4 clients.
STEADY_RATE=1000

# The benchmark cluster's configuration, recorded in the results page.
# start_cluster writes "fsync = off" first: the later line wins.
CLUSTER_CONF="shared_preload_libraries = 'pg_idem'
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 256MB
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 1h
track_wal_io_timing = on
autovacuum = off
autovacuum_naptime = 1s
jit = off"

# as_run_user passes the cluster's environment on; it is empty until
# start_cluster, and pg_test_fsync runs before it.
PGHOST=${PGHOST:-} PGPORT=${PGPORT:-} PGUSER=${PGUSER:-} PGDATABASE=${PGDATABASE:-}

# The clients run as whoever runs make bench (only the server may not be
# root): no runuser around every psql and pgbench.
client() { PATH="$PG_BIN:$PATH" "$@"; }
q() { client psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

START_TIME=$(date +%s)
install_missing_packages gnuplot-nox bc
make_workdir bench
build_and_install_extension "$ROOT"
copy_tree "$ROOT"
SCRIPTS=$WORK/src/tests/bench/scripts
mkdir -p "$WORK/runs" "$WORK/info" "$WORK/wakeup" "$WORK/steady"
INFO=$WORK/info

# The C++ client's wake-up benchmark and tests/bench/client's cycle driver,
# when the client has them.  Built outside the tree and kept between runs
# (an unchanged client rebuilds in a second).
CLIENT_BUILD=${TMPDIR:-/tmp}/pg_idem-bench-client.$(id -u).$(printf '%s' "$ROOT" | md5sum | cut -c1-8)
CLIENT_OK=f
if [ -f "$ROOT/client/cpp/CMakeLists.txt" ] && [ -f "$ROOT/client/cpp/bench/CMakeLists.txt" ]; then
    say "building the C++ client's benchmarks in $CLIENT_BUILD"
    if cmake -S "$BENCH/client" -B "$CLIENT_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DPG_IDEM_CLIENT_DIR="$ROOT/client/cpp" >"$INFO/client-build.log" 2>&1 &&
       cmake --build "$CLIENT_BUILD" -j2 --target idem_wakeup_bench idem_cycle_bench \
            >>"$INFO/client-build.log" 2>&1; then
        CLIENT_OK=t
    else
        tail -n 20 "$INFO/client-build.log"
        echo "the C++ client's benchmarks did not build: wake-up not measured"
    fi
fi

# The disk's flush rate, before the server starts writing to it.  Quick
# mode keeps only the first tests (fdatasync, wal_sync_method's default
# on Linux, comes second) and stops the rest.
say "pg_test_fsync"
FSYNC_LIMIT=$([ "$MODE" != full ] && echo 2.5 || echo 600)
as_run_user timeout "$FSYNC_LIMIT" "$PG_BIN/pg_test_fsync" -s "$FSYNC_SECS" \
    -f "$WORK/fsync.tmp" >"$INFO/pg_test_fsync.txt" 2>&1 || true
grep -E 'ops/sec' "$INFO/pg_test_fsync.txt" | head -5
rm -f "$WORK/fsync.tmp"

start_cluster "$CLUSTER_CONF"
BG_PIDS=()
finish() {
    local rc=$? pid
    for pid in "${BG_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ "${BENCH_KEEP:-0}" = 1 ] && KEEP_WORK=1
    finish_workdir "$rc"
}
trap finish EXIT

say "preparing the benchmark database"
q -c "CREATE EXTENSION pg_idem" -f "$WORK/src/tests/bench/sql/setup.sql" >/dev/null
# The SQL edition beside it: the plain script in a database of its own,
# whose search_path finds it as the C edition's is found; the runner's
# helpers there too (they read idem_keys through the search_path).
SQL_DB=bench_sql
HAVE_SQL_EDITION=f
if [ -f "$WORK/src/extension/sql_edition/build.py" ]; then
    python3 "$WORK/src/extension/sql_edition/build.py" plain "$WORK/pg_idem_sql.sql"
    q -c "CREATE DATABASE $SQL_DB" -c "ALTER DATABASE $SQL_DB SET search_path = idem, public"
    q -d "$SQL_DB" -v schema=idem -f "$WORK/pg_idem_sql.sql" \
      -f "$WORK/src/tests/bench/sql/setup.sql" >/dev/null
    HAVE_SQL_EDITION=t
fi
q -c "SELECT name, setting, unit, source FROM pg_settings
       WHERE source NOT IN ('default', 'override')
          OR name IN ('server_version', 'wal_level', 'wal_sync_method', 'wal_buffers',
                      'wal_compression', 'data_checksums', 'huge_pages', 'max_connections',
                      'checkpoint_completion_target', 'idem.lease', 'idem.ttl')
       ORDER BY name" -F $'\t' >"$INFO/settings.tsv"
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "mode=$MODE rounds=$ROUNDS secs=$SECS steady_phase=$STEADY_PHASE steady_warmup=$STEADY_WARMUP steady_ttl=$STEADY_TTL"
    echo "nproc=$(nproc)"
    echo "memory=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "kernel=$(uname -sr)"
    echo "postgres=$(q -c 'SELECT version()')"
    echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
        [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ] && echo ' (with uncommitted changes)')"
    echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$INFO/machine.txt"

# What this build offers besides claims: the outbox (issue 6), the C++
# client's wake-up benchmark, the cleanup worker (issue 8).
HAVE_OUTBOX=$(q -c "SELECT count(DISTINCT proname) = 3 FROM pg_proc
                     WHERE proname IN ('idem_outbox_stage', 'idem_outbox_claim', 'idem_outbox_ack')")
HAVE_WORKER=$(q -c "SELECT count(*) > 0 FROM pg_settings WHERE name = 'idem.cleanup_worker'")
{
    echo "outbox=$HAVE_OUTBOX"
    echo "worker=$HAVE_WORKER"
    echo "wakeup=$CLIENT_OK"
    echo "sql_edition=$HAVE_SQL_EDITION"
    # The worker's pacing default, which issue 35's target for the claims'
    # p99 during a cleanup is judged at (the growth section's pacing part).
    if [ "$HAVE_WORKER" = t ]; then
        echo "cleanup_delay_default=$(q -c "SELECT boot_val FROM pg_settings WHERE name = 'idem.cleanup_delay'")"
    fi
} >"$INFO/features.txt"
# The worker stays off during the matrix: a pass would land in some run's WAL.
[ "$HAVE_WORKER" = t ] && q -c "ALTER SYSTEM SET idem.cleanup_worker = off" -c "SELECT pg_reload_conf()" >/dev/null

# ---------------------------------------------------------------------------
# The cells: GROUP|VARIANT|SCENARIO|CLIENTS|SYNC|SCRIPT|TABLE|RESET|ROWS|ARGS|BEFORE|AFTER
# (RESET/ROWS: the rows the table starts with; ARGS: more pgbench options;
# BEFORE/AFTER: SQL run around the cell).  The cells of one group run back
# to back within a round.
CELLS=()
table_of() {
    case $1 in
        floor|floor_oc) echo bench.idem_floor ;;
        minimal) echo bench.idem_minimal ;;
        cte) echo bench.idem_cte ;;
        plpgsql) echo bench.idem_plpgsql ;;
        *) echo idem_keys ;;
    esac
}
add_cell() {   # GROUP VARIANT SCENARIO CLIENTS SYNC RESET ROWS [ARGS [BEFORE [AFTER]]]
    local table script=${3%%[0-9]*}-$2
    table=$(table_of "$2")
    case $2 in
        # pg_idem with its in-transaction trigger disabled: what the trigger costs.
        pg_idem_notrig) script=${3%%[0-9]*}-pg_idem ;;
        # The SQL edition answers the C edition's calls: the same script.
        sql_edition) script=${3%%[0-9]*}-pg_idem ;;
    esac
    case $3 in outbox*) table=idem_outbox_queue ;; esac
    # The bare SELECT of a replay reads the very rows pg_idem replays.
    [ "$3" = replay ] && [ "$2" = floor ] && table=idem_keys
    CELLS+=("$1|$2|$3|$4|$5|$script|$table|$6|$7|${8:-}|${9:-}|${10:-}")
}
add_group() {   # SCENARIO CLIENTS SYNC RESET ROWS ARGS VARIANT...
    local scenario=$1 clients=$2 sync=$3 reset=$4 rows=$5 args=$6 v
    shift 6
    for v in "$@"; do
        add_cell "$scenario/c$clients/$sync" "$v" "$scenario" "$clients" "$sync" "$reset" "$rows" "$args"
    done
}
ALL="minimal floor cte plpgsql pg_idem"
# The cells the SQL edition runs in too (issue 32: the claim cycle, the replay).
SQL_EDITION=$([ "$HAVE_SQL_EDITION" = t ] && echo sql_edition || true)
NOTRIG_ON="ALTER TABLE idem_keys DISABLE TRIGGER idem_keys_claim_finished"
NOTRIG_OFF="ALTER TABLE idem_keys ENABLE TRIGGER idem_keys_claim_finished"
for sync in on off; do
    for clients in 1 4 16; do
        group=cycle/c$clients/$sync
        add_group cycle "$clients" "$sync" none 0 "" $ALL $SQL_EDITION
        # One commit per request, beside the lease-mode cells it is compared
        # with: the disk's flush time drifts from minute to minute.
        if [ "$sync" = on ] && [ "$clients" != 4 ]; then
            for v in minimal floor plpgsql pg_idem; do
                add_cell "$group" "$v" intx "$clients" on none 0
            done
        fi
        # Probes without commit flushes: what a race-safe insert and the
        # in-transaction trigger each cost (the CHECK constraints' cost is
        # floor against minimal, in the same group).
        if [ "$sync" = off ] && [ "$clients" = 1 ]; then
            add_cell "$group" floor_oc cycle 1 off none 0
            add_cell "$group" pg_idem_notrig cycle 1 off none 0 "" "$NOTRIG_ON" "$NOTRIG_OFF"
        fi
    done
done
add_group replay 4 on completed 10000 "" $ALL lookup $SQL_EDITION
add_group hot64 16 on none 0 "-D hot=64" $ALL
add_group hot1 16 on none 0 "-D hot=1" $ALL
add_group renew 4 on pending 1000 "" $ALL
# The outbox (pg_idem only): staging, and draining by 2 drainers at batch 1,
# 10 and 100 from a seeded backlog that lasts the run.
if [ "$HAVE_OUTBOX" = t ]; then
    add_cell outbox pg_idem outbox_stage 4 on none 0
    add_cell outbox pg_idem outbox_drain1 2 on outbox $((4000 * SECS)) "-D batch=1"
    add_cell outbox pg_idem outbox_drain10 2 on outbox $((15000 * SECS)) "-D batch=10"
    add_cell outbox pg_idem outbox_drain100 2 on outbox $((50000 * SECS)) "-D batch=100"
fi

# CPU time of the server's exited children (backends), in clock ticks: the
# postmaster reaps every backend, so the difference around a run is what
# the run's sessions cost the server, whoever else uses the machine.
POSTMASTER=$(head -1 "$WORK/data/postmaster.pid")
TICKS=$(getconf CLK_TCK)
children_cpu() { awk '{print $16 + $17}' "/proc/$POSTMASTER/stat"; }

# One run of one cell: reset, snapshot, pgbench, snapshot.  Everything it
# measured goes to $WORK/runs/NNNN/ for report.py.
RUN_NO=0
run_cell() {   # CELL-SPEC ROUND
    local group variant scenario clients sync script table reset rows args before after
    local dir jobs cpu0 cpu1 prep=()
    IFS='|' read -r group variant scenario clients sync script table reset rows args before after <<<"$1"
    # The SQL edition's cells run in its database (q and pgbench read PGDATABASE).
    local -x PGDATABASE=$PGDATABASE
    [ "$variant" = sql_edition ] && PGDATABASE=$SQL_DB
    RUN_NO=$((RUN_NO + 1))
    dir=$WORK/runs/$(printf '%04d' "$RUN_NO")
    mkdir -p "$dir"
    jobs=$((clients < 2 ? clients : 2))
    printf 'group=%s\nvariant=%s\nscenario=%s\nclients=%s\nsync=%s\nround=%s\nsecs=%s\ntable=%s\nrows=%s\n' \
        "$group" "$variant" "$scenario" "$clients" "$sync" "$2" "$SECS" "$table" "$rows" >"$dir/meta"

    # Reset the table, checkpoint, and snapshot the counters: one session,
    # its statistics flushed before the snapshot reads them.
    prep+=(-c "SELECT bench.reset('$table', '$reset', $rows)")
    [ "$rows" -gt 0 ] && prep+=(-c "VACUUM ANALYZE $table")
    # Full mode writes enough WAL to reach max_wal_size: a checkpoint before
    # every run keeps them all out of the runs.
    if [ "$rows" -gt 0 ] || [ "$MODE" = full ]; then prep+=(-c "CHECKPOINT"); fi
    [ -n "$before" ] && prep+=(-c "$before")
    q -c "CALL bench.wait_for_clients()" "${prep[@]}" \
      -c "SELECT pg_stat_force_next_flush()" -c "SELECT bench.snapshot('$table')" |
        tail -1 >"$dir/before"
    cut -d' ' -f1 /proc/loadavg >"$dir/load"
    cpu0=$(children_cpu)

    # shellcheck disable=SC2086
    PGOPTIONS="-c synchronous_commit=$sync" client pgbench -n -M prepared -r \
        -T "$SECS" -c "$clients" -j "$jobs" --log --log-prefix="$dir/log" \
        -f "$SCRIPTS/$script.sql" $args >"$dir/pgbench.out" 2>&1 ||
        echo "pgbench_exit=$?" >>"$dir/meta"

    # Flush everything up to here (one synchronous commit), so that
    # pg_waldump can read to the end of the run.
    q -c "CALL bench.wait_for_clients()" -c "SELECT bench.snapshot('$table')" \
        -c "SELECT txid_current()" | sed -n 1p >"$dir/after"
    cpu1=$(children_cpu)
    echo "cpu_seconds=$(echo "scale=3; ($cpu1 - $cpu0) / $TICKS" | bc)" >>"$dir/meta"
    [ -n "$after" ] && q -c "$after"

    # Latency percentiles from the per-transaction log (microseconds).
    { cat "$dir"/log.* 2>/dev/null || true; } | awk '$3 ~ /^[0-9]+$/ {print $3}' | sort -n |
        awk '{a[NR] = $1} END {if (NR) print NR, a[int(NR * 0.50 + 0.5)], a[int(NR * 0.99 + 0.5)]; else print 0, 0, 0}' \
            >"$dir/latency"
    rm -f "$dir"/log.*

    # What the WAL of the run consists of, record type by record type, in
    # each cell's first run (quick mode: the cells the results page shows).
    if [ "$2" = 1 ] && { [ "$MODE" = full ] || [ "$group" = cycle/c1/on ]; }; then
        local from to
        from=$(cut -d, -f1 "$dir/before")
        to=$(cut -d, -f1 "$dir/after")
        client pg_waldump --stats=record -p "$WORK/data/pg_wal" \
            -s "$(printf '%X/%X' $((from >> 32)) $((from & 0xffffffff)))" \
            -e "$(printf '%X/%X' $((to >> 32)) $((to & 0xffffffff)))" \
            >"$dir/waldump" 2>&1 || true
    fi
}

say "running ${#CELLS[@]} cells x $ROUNDS rounds x ${SECS}s ($MODE mode)"
for round in $(seq 1 "$ROUNDS"); do
    # Rotate the variants within each group by the round number.
    i=0
    while [ $i -lt ${#CELLS[@]} ]; do
        group=${CELLS[$i]%%|*}
        members=()
        while [ $i -lt ${#CELLS[@]} ] && [ "${CELLS[$i]%%|*}" = "$group" ]; do
            members+=("${CELLS[$i]}")
            i=$((i + 1))
        done
        n=${#members[@]}
        for k in $(seq 0 $((n - 1))); do
            run_cell "${members[$(((k + round - 1) % n))]}" "$round"
        done
    done
    echo "round $round of $ROUNDS done ($(($(date +%s) - START_TIME)) s)"
done

# ---------------------------------------------------------------------------
# A new connection per request against one kept connection, in both
# editions: what a backend pays once, before and at its first request.
# The SQL edition's backend compiles its PL/pgSQL functions and fills its
# caches at first use; the cells above start their clients' connections
# anew, so in a short cell with many clients that cost is a large share of
# the SQL edition's numbers (results/sql_edition.md says how large).
if [ "$HAVE_SQL_EDITION" = t ]; then
    CONNECT_REQUESTS=$([ "$MODE" = quick ] && echo 200 || echo 1000)
    say "a new connection per request against a kept one ($CONNECT_REQUESTS requests each, C and SQL edition)"
    echo "variant,connection,requests,cpu_seconds" >"$INFO/connect.csv"
    for variant in pg_idem sql_edition; do
        for how in kept new; do
            db=$PGDATABASE
            [ "$variant" = sql_edition ] && db=$SQL_DB
            q -c "CALL bench.wait_for_clients()"
            cpu0=$(children_cpu)
            PGDATABASE=$db PGOPTIONS="-c synchronous_commit=off" client pgbench -n -M prepared \
                $([ "$how" = new ] && echo -C) -t "$CONNECT_REQUESTS" -c 1 \
                -f "$SCRIPTS/cycle-pg_idem.sql" >"$INFO/connect-$variant-$how.out" 2>&1 ||
                echo "pgbench_exit=$?" >>"$INFO/connect-$variant-$how.out"
            q -c "CALL bench.wait_for_clients()"
            cpu1=$(children_cpu)
            echo "$variant,$how,$CONNECT_REQUESTS,$(echo "scale=3; ($cpu1 - $cpu0) / $TICKS" | bc)" >>"$INFO/connect.csv"
        done
    done
    cat "$INFO/connect.csv"
fi

# ---------------------------------------------------------------------------
# Through the C++ client: followers' wake-up after the winner's finalize
# (advisory lock, and polling only), and the uncontended cycle with the
# wake-up and without it.
if [ "$CLIENT_OK" = t ]; then
    say "C++ client: follower wake-up ($WAKE_ROUNDS rounds) and the uncontended cycle"
    DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=$PGDATABASE"
    "$CLIENT_BUILD/client/bench/idem_wakeup_bench" "$DSN" "$WAKE_ROUNDS" 4 \
        >"$WORK/wakeup/wakeup.out" 2>&1 || echo "exit=$?" >>"$WORK/wakeup/wakeup.out"
    # Without commit flushes: the wake-up does not change them, and the
    # disk's drift would drown what it does change (and the relative cost
    # is largest this way).
    "$CLIENT_BUILD/idem_cycle_bench" "$DSN options='-c synchronous_commit=off'" \
        "$CYCLE_SECS" "$CYCLE_ROUNDS" \
        >"$WORK/wakeup/cycle.out" 2>&1 || echo "exit=$?" >>"$WORK/wakeup/cycle.out"
    cat "$WORK/wakeup/wakeup.out"
fi

# ---------------------------------------------------------------------------
# Steady state: pg_idem under a constant offered load with idem.ttl short,
# keys deleted by idem_cleanup (a client calling it five times a second, as
# a cron job would) or by the cleanup worker, autovacuum on.  After a
# warm-up (the live set fills up to idem.ttl of traffic), three phases:
# steady; a transaction holding back the xmin horizon; after it ends.
steady_state() {   # NAME CLEANER
    local name=$1 cleaner=$2 dir=$WORK/steady/$1 total start t phase now
    local held_from=$((STEADY_WARMUP + STEADY_PHASE))
    total=$((STEADY_WARMUP + 2 * STEADY_PHASE + STEADY_RECOVERY))
    mkdir -p "$dir"
    say "steady state ($name): ${total}s at $STEADY_RATE requests/s, idem.ttl $STEADY_TTL"
    q -c "TRUNCATE idem_keys" \
      -c "ALTER SYSTEM SET autovacuum = on" \
      -c "ALTER SYSTEM SET idem.ttl = '$STEADY_TTL'" >/dev/null
    if [ "$cleaner" = worker ]; then
        q -c "ALTER SYSTEM SET idem.cleanup_worker = on" \
          -c "ALTER SYSTEM SET idem.cleanup_interval = '1s'" >/dev/null
    fi
    q -c "SELECT pg_reload_conf()" >/dev/null
    sleep 0.2
    echo "cleaner=$cleaner rate=$STEADY_RATE ttl=$STEADY_TTL warmup=$STEADY_WARMUP phase=$STEADY_PHASE recovery=$STEADY_RECOVERY" \
        >"$dir/meta"

    start=$(date +%s.%N)
    client pgbench -n -M prepared -T "$total" -c 4 -j 2 -R "$STEADY_RATE" \
        -f "$SCRIPTS/cycle-pg_idem.sql" >"$dir/pgbench.out" 2>&1 &
    BG_PIDS+=($!)
    if [ "$cleaner" = cleanup ]; then
        client pgbench -n -M prepared -T "$total" -c 1 -R 5 \
            -f "$SCRIPTS/cleanup.sql" >"$dir/cleanup.out" 2>&1 &
        BG_PIDS+=($!)
    fi
    : >"$dir/samples"
    for t in $(seq 1 "$total"); do
        now=$(date +%s.%N)
        sleep "$(echo "$start + $t - $now" | bc | sed 's/^-.*/0/')"
        if [ "$t" -le "$STEADY_WARMUP" ]; then phase=warmup
        elif [ "$t" -le "$held_from" ]; then phase=steady
        elif [ "$t" -le $((held_from + STEADY_PHASE)) ]; then phase=held
        else phase=recovery; fi
        echo "$t,$phase,$(q -c 'SELECT bench.steady_sample()')" >>"$dir/samples"
        if [ "$t" = "$held_from" ]; then
            # An xid held open: vacuum can remove nothing deleted after it.
            q -c "BEGIN; SELECT txid_current(); SELECT pg_sleep($STEADY_PHASE); COMMIT;" \
                >/dev/null &
            BG_PIDS+=($!)
        fi
    done
    wait
    BG_PIDS=()
    q -c "ALTER SYSTEM RESET idem.ttl" -c "ALTER SYSTEM SET autovacuum = off" >/dev/null
    [ "$cleaner" = worker ] && q -c "ALTER SYSTEM SET idem.cleanup_worker = off" >/dev/null
    q -c "SELECT pg_reload_conf()" >/dev/null
}

if [ "$HAVE_WORKER" = t ]; then
    steady_state worker worker
    [ "$MODE" = full ] && steady_state cleanup cleanup
else
    steady_state cleanup cleanup
fi

echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$INFO/machine.txt"
echo "wall_seconds=$(($(date +%s) - START_TIME))" >>"$INFO/machine.txt"
stop_cluster

# The outbox against a bare queue floor (and pgmq when PGMQ_SQL names its
# SQL file), on a cluster of its own: results/outbox.md, and its CSVs in
# $WORK/outbox for the targets table.  A failure there leaves the claim
# results standing (the outbox targets read n/a).
if [ "$HAVE_OUTBOX" = t ]; then
    OUTBOX_COPY=$WORK/outbox bash "$BENCH/outbox.sh" "$MODE" ||
        echo "the outbox benchmark failed (exit $?): its targets are not measured" >&2
    # The same cells by instruction count (callgrind): what the server does
    # per event, whatever the machine's load and disk (results/outbox_instructions.md).
    bash "$BENCH/outbox_instructions.sh" ||
        echo "the outbox instruction probe failed (exit $?)" >&2
fi
# Cost as the work grows (clients, keys piling up, follower wake-up), on
# a cluster of its own: results/growth.md.
GROWTH_COPY=$WORK/growth bash "$BENCH/growth.sh" "$MODE" ||
    echo "the growth benchmark failed (exit $?): its curves are not measured" >&2
echo "total_wall_seconds=$(($(date +%s) - START_TIME))" >>"$INFO/machine.txt"

say "report"
python3 "$BENCH/report.py" "$WORK" "$RESULTS" "$BENCH/plots"
# The SQL edition against the C edition and PL/pgSQL, from the CSVs just written.
if [ "$HAVE_SQL_EDITION" = t ]; then
    python3 "$BENCH/sql_edition_report.py" "$RESULTS" "$INFO/machine.txt" "$INFO/connect.csv"
fi
