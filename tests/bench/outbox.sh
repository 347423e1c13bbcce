#!/usr/bin/env bash
# make bench's outbox section (issue 13): pg_idem's outbox against a bare
# queue floor with pgmq's shape, in one run, interleaved, on a throwaway
# cluster of its own; writes tests/bench/results/outbox.md (and raw CSV).
#
#   bash tests/bench/outbox.sh [quick|medium|full]     (make bench runs it too)
#
# Variants, every one on one table (tests/bench/outbox/*.sql):
#   pg_idem         idem_outbox_stage / _stage_batch, idem_outbox_claim + _ack
#                   (published events archived: idem.outbox_archive = on)
#   pg_idem_noarch  the same with idem.outbox_archive = off (no retention)
#   sql_edition     pg_idem's SQL edition (extension/sql_edition/, the plain
#                   script), the same calls, archive on, in a database of its
#                   own (bench_sql) on the same cluster
#   floor           plain SQL with pgmq's shape: INSERT; SELECT ... FOR UPDATE
#                   SKIP LOCKED + UPDATE of a visibility time; DELETE
#   pgmq            pgmq itself (send, send_batch, read, delete), only when
#                   PGMQ_SQL names pgmq's SQL file (pgmq-extension/sql/pgmq.sql
#                   of a checkout of github.com/pgmq/pgmq; never downloaded
#                   here, never committed); PGMQ_COMMIT names its commit
#                   when the file is not in a git checkout
#
# Cells (events per second; 4 clients unless said): stage 1 per transaction,
# stage 100 per transaction, claim+ack 1, claim+ack 100 (from a seeded
# backlog), 2 producers + 2 drainers (batch 10) from an empty queue, and
# claim+ack 1 and 100 by one drainer without commit flushes (what the
# statements cost, the disk left out; full mode only).  Then
# one client's whole life of EVENTS events (staged by 100, drained by 100):
# WAL per event (stage to ack, and the drain alone), and the size of the
# queue (and archive) after a VACUUM.  Prints issue 13's outbox targets as a
# pass/fail table (outbox_report.py).
#
# OUTBOX_COPY=DIR (make bench sets it) also copies the CSVs and machine.txt
# to DIR, for tests/bench/report.py's targets table, and prints no table.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tests/bench
RESULTS=$BENCH/results
. "$ROOT/tests/lib.sh"

MODE=${1:-quick}
case $MODE in
    quick) ROUNDS=${OUTBOX_ROUNDS:-2} SECS=${OUTBOX_SECS:-2} EVENTS=20000 ;;
    medium) ROUNDS=3 SECS=4 EVENTS=20000 ;;
    full)  ROUNDS=3 SECS=10 EVENTS=100000 ;;
    *) echo "usage: $0 [quick|medium|full]" >&2; exit 2 ;;
esac

CLUSTER_CONF="shared_preload_libraries = 'pg_idem'
fsync = on
synchronous_commit = on
shared_buffers = 256MB
max_wal_size = 8GB
checkpoint_timeout = 1h
autovacuum = off
idem.cleanup_worker = off
jit = off"

PGHOST=${PGHOST:-} PGPORT=${PGPORT:-} PGUSER=${PGUSER:-} PGDATABASE=${PGDATABASE:-}
client() { PATH="$PG_BIN:$PATH" "$@"; }
q() { client psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

make_workdir bench-outbox
build_and_install_extension "$ROOT"
start_cluster "$CLUSTER_CONF"
BENCH_DB=$PGDATABASE
SCRIPTS=$BENCH/outbox
OUT=$WORK/outbox.csv
echo "round,cell,variant,events,seconds,events_per_s,load,cpu_s" >"$OUT"

VARIANTS="pg_idem pg_idem_noarch floor"
SQL_DB=bench_sql
if [ -f "$ROOT/extension/sql_edition/build.py" ]; then
    python3 "$ROOT/extension/sql_edition/build.py" plain "$WORK/pg_idem_sql.sql"
    q -c "CREATE DATABASE $SQL_DB" -c "ALTER DATABASE $SQL_DB SET search_path = idem, public"
    q -d "$SQL_DB" -v schema=idem -f "$WORK/pg_idem_sql.sql" >/dev/null
    VARIANTS="$VARIANTS sql_edition"
fi
q -c "CREATE EXTENSION pg_idem" -c "CREATE SCHEMA floor" -c "
CREATE TABLE floor.q (
    msg_id      bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    read_ct     integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    vt          timestamptz NOT NULL,
    message     jsonb)" -c "CREATE INDEX ON floor.q (vt)"
if [ -n "${PGMQ_SQL:-}" ] && [ -f "$PGMQ_SQL" ]; then
    q -f "$PGMQ_SQL" >/dev/null && q -c "SELECT pgmq.create('bench')" >/dev/null &&
        VARIANTS="$VARIANTS pgmq"
    # PGMQ_VERSION: what the results page names (pgmq's control file, when beside it).
    PGMQ_VERSION=${PGMQ_VERSION:-$(sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" \
        "$(dirname "$PGMQ_SQL")/../pgmq.control" 2>/dev/null || true)}
    # PGMQ_COMMIT: the commit the page names (git's, when PGMQ_SQL is in a checkout).
    PGMQ_COMMIT=${PGMQ_COMMIT:-$(git -C "$(dirname "$PGMQ_SQL")" rev-parse HEAD 2>/dev/null || true)}
    PGMQ_VERSION="${PGMQ_VERSION:-unknown version}${PGMQ_COMMIT:+, commit $PGMQ_COMMIT}"
fi
echo "variants: $VARIANTS"

table_of() {
    case $1 in
        pg_idem*|sql_edition) echo idem_outbox_queue ;;
        floor) echo floor.q ;;
        pgmq) echo pgmq.q_bench ;;
    esac
}
script_of() {   # the SQL edition answers pg_idem's calls: the same scripts
    local v=${2%_noarch}
    echo "$SCRIPTS/$1-${v/sql_edition/pg_idem}.sql"
}
# The SQL edition's variant runs in its own database (q, pgbench and
# psql read PGDATABASE).
database_of() { [ "$1" = sql_edition ] && echo "$SQL_DB" || echo "$BENCH_DB"; }
options_of() { [ "$1" = pg_idem_noarch ] && echo "-c idem.outbox_archive=off" || true; }

# Empty a variant's tables; seed N claimable events.
reset_variant() {   # VARIANT ROWS
    local payload
    payload=$(sed -n "s/.*'\({.*}\)'::jsonb.*/\1/p" "$SCRIPTS/stage1-floor.sql")
    case $1 in
        pg_idem*|sql_edition) q -c "TRUNCATE idem_outbox_queue, idem_outbox_claimed" \
                    -c "INSERT INTO idem_outbox_queue (topic, payload, available_at, scope)
                        SELECT 'orders', '$payload', clock_timestamp(), current_user::text::regrole::oid
                          FROM generate_series(1, $2)" ;;
        floor) q -c "TRUNCATE floor.q" \
                 -c "INSERT INTO floor.q (vt, message) SELECT clock_timestamp(), '$payload'
                       FROM generate_series(1, $2)" ;;
        pgmq) q -c "TRUNCATE pgmq.q_bench, pgmq.a_bench" \
                -c "INSERT INTO pgmq.q_bench (vt, message) SELECT clock_timestamp(), '$payload'
                      FROM generate_series(1, $2)" ;;
    esac
    q -c "VACUUM ANALYZE $(table_of "$1")"
}
counter() { q -c "SELECT n_tup_$2 FROM pg_stat_user_tables WHERE relid = '$1'::regclass"; }

# CPU time of the server's exited children (backends), in clock ticks, as
# in run.sh: around a cell, what its sessions cost the server.
POSTMASTER=$(head -1 "$WORK/data/postmaster.pid")
TICKS=$(getconf CLK_TCK)
children_cpu() { awk '{print $16 + $17}' "/proc/$POSTMASTER/stat"; }

# One cell of one variant: events/s from the table's insert or delete count.
run_cell() {   # ROUND CELL VARIANT
    local round=$1 cell=$2 v=$3 table rows=0 counted=ins before after t0 t1 events load cpu0 cpu1
    local -x PGDATABASE
    PGDATABASE=$(database_of "$v")
    table=$(table_of "$v")
    case $cell in
        drain1) rows=$((10000 * SECS)); counted=del ;;
        drain100) rows=$((250000 * SECS)); counted=del ;;
        solo1) rows=$((10000 * SECS)); counted=del ;;
        solo100) rows=$((200000 * SECS)); counted=del ;;
        mixed) counted=del ;;
    esac
    reset_variant "$v" "$rows" >/dev/null
    q -c "SELECT pg_stat_force_next_flush()" >/dev/null
    sleep 0.2
    cpu0=$(children_cpu)
    before=$(counter "$table" "$counted")
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s.%N)
    case $cell in
        stage1|stage100)
            PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -T "$SECS" -c 4 -j 2 \
                -f "$(script_of "$cell" "$v")" >"$WORK/pgbench.out" 2>&1 ;;
        drain1|drain100)
            PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -T "$SECS" -c 4 -j 2 \
                -D batch="${cell#drain}" -f "$(script_of drain "$v")" >"$WORK/pgbench.out" 2>&1 ;;
        solo1|solo100)
            PGOPTIONS="-c synchronous_commit=off $(options_of "$v")" client pgbench -n -M prepared \
                -T "$SECS" -c 1 -D batch="${cell#solo}" -f "$(script_of drain "$v")" \
                >"$WORK/pgbench.out" 2>&1 ;;
        mixed)
            PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -T "$SECS" -c 2 -j 1 \
                -f "$(script_of stage1 "$v")" >"$WORK/pgbench-p.out" 2>&1 &
            PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -T "$SECS" -c 2 -j 1 \
                -D batch=10 -f "$(script_of drain "$v")" >"$WORK/pgbench.out" 2>&1
            wait ;;
    esac
    t1=$(date +%s.%N)
    grep -q "number of failed transactions: 0" "$WORK/pgbench.out" ||
        { cat "$WORK/pgbench.out"; echo "pgbench failed: $cell $v" >&2; exit 1; }
    # Backends flush their table statistics when they exit.
    sleep 0.5
    q -c "SELECT pg_stat_force_next_flush()" >/dev/null
    after=$(counter "$table" "$counted")
    cpu1=$(children_cpu)
    events=$((after - before))
    echo "$round,$cell,$v,$events,$SECS,$(echo "scale=1; $events / $SECS" | bc),$load,$(
        echo "scale=3; ($cpu1 - $cpu0) / $TICKS" | bc)" >>"$OUT"
    printf '  %-9s %-15s %9.0f events/s\n' "$cell" "$v" "$(echo "scale=1; $events / $SECS" | bc)"
}

# The solo cells are probes (drain1 and drain100 without the disk): full
# mode only, which keeps quick mode's make bench near 5 minutes.
CELLS="stage1 stage100 drain1 drain100 mixed"
[ "$MODE" = full ] && CELLS="$CELLS solo1 solo100"
say "outbox cells: $ROUNDS rounds x ${SECS}s, variants rotated"
for round in $(seq 1 "$ROUNDS"); do
    for cell in $CELLS; do
        set -- $VARIANTS
        n=$#
        vs=($VARIANTS)
        for k in $(seq 0 $((n - 1))); do
            run_cell "$round" "$cell" "${vs[$(((k + round - 1) % n))]}"
        done
    done
done

# The WAL records between two LSNs by type, appended to $RECORDS as
# variant,step,record,count,bytes (full-page images included).
RECORDS=$WORK/outbox_wal_records.csv
echo "variant,step,record,count,bytes" >"$RECORDS"
wal_records() {   # VARIANT STEP FROM TO
    as_run_user "$PG_BIN/pg_waldump" -p "$WORK/data/pg_wal" --stats=record -s "$3" -e "$4" 2>/dev/null |
        sed 's/( *[0-9.]*)//g' |
        awk -v v="$1" -v s="$2" 'NF == 5 && $2 ~ /^[0-9]+$/ && $2 > 0 { print v "," s "," $1 "," $2 "," $5 }' \
            >>"$RECORDS"
}

# One client's whole life of EVENTS events per variant: WAL and size.
LIFE=$WORK/life.csv
echo "variant,events,wal_total,wal_drain,queue_bytes,archive_bytes" >"$LIFE"
say "life of $EVENTS events: WAL per event, size after consuming and VACUUM"
for v in $VARIANTS; do
    export PGDATABASE
    PGDATABASE=$(database_of "$v")
    reset_variant "$v" 0 >/dev/null
    q -c "CHECKPOINT"
    read -r l0 p0 < <(q -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), pg_current_wal_lsn()")
    PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -c 1 -t $((EVENTS / 100)) \
        -f "$(script_of stage100 "$v")" >/dev/null
    read -r l1 p1 < <(q -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), pg_current_wal_lsn()")
    PGOPTIONS=$(options_of "$v") client pgbench -n -M prepared -c 1 -t $((EVENTS / 100)) \
        -D batch=100 -f "$(script_of drain "$v")" >/dev/null
    read -r l2 p2 < <(q -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), pg_current_wal_lsn()")
    # What each step wrote, by record type (pg_waldump --stats=record).
    wal_records "$v" stage "$p0" "$p1"
    wal_records "$v" drain "$p1" "$p2"
    case $v in
        pg_idem*|sql_edition) left=$(q -c "SELECT count(*) FROM idem_outbox WHERE state <> 'published'") ;;
        *) left=$(q -c "SELECT count(*) FROM $(table_of "$v")") ;;
    esac
    [ "$left" = 0 ] || echo "warning: $v left $left events" >&2
    q -c "VACUUM $(table_of "$v")"
    case $v in
        pg_idem*|sql_edition) q -c "VACUUM idem_outbox_claimed"
                  arch=$(q -c "SELECT pg_total_relation_size('idem_outbox_claimed')") ;;
        pgmq) arch=$(q -c "SELECT pg_total_relation_size('pgmq.a_bench')") ;;
        *) arch=0 ;;
    esac
    qsize=$(q -c "SELECT pg_total_relation_size('$(table_of "$v")')")
    echo "$v,$EVENTS,$((${l2%.*} - ${l0%.*})),$((${l2%.*} - ${l1%.*})),$qsize,$arch" >>"$LIFE"
    echo "  $v: $(( (${l2%.*} - ${l0%.*}) / EVENTS )) B WAL per event, queue $qsize B, archive $arch B"
done
PGDATABASE=$BENCH_DB

{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "mode=$MODE"
    echo "rounds=$ROUNDS"
    echo "secs=$SECS"
    echo "events=$EVENTS"
    echo "nproc=$(nproc)"
    echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "postgres=$(q -c 'SELECT version()')"
    echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "pgmq=${PGMQ_VERSION:-not run}"
} >"$WORK/machine.txt"
stop_cluster
mkdir -p "$RESULTS/raw"
cp "$OUT" "$RESULTS/raw/outbox.csv"
cp "$LIFE" "$RESULTS/raw/outbox_life.csv"
cp "$RECORDS" "$RESULTS/raw/"
# With the machine's description the page can be written again from raw/
# (outbox_report.py raw/outbox.csv raw/outbox_life.csv raw/outbox_machine.txt PAGE),
# after a change of why.py's account, say.
cp "$WORK/machine.txt" "$RESULTS/raw/outbox_machine.txt"
if [ -n "${OUTBOX_COPY:-}" ]; then
    mkdir -p "$OUTBOX_COPY"
    cp "$OUT" "$LIFE" "$RECORDS" "$WORK/machine.txt" "$OUTBOX_COPY/"
    python3 "$BENCH/outbox_report.py" "$OUT" "$LIFE" "$WORK/machine.txt" "$RESULTS/outbox.md" \
        >/dev/null
    echo "outbox results: $RESULTS/outbox.md (targets in make bench's table)"
else
    python3 "$BENCH/outbox_report.py" "$OUT" "$LIFE" "$WORK/machine.txt" "$RESULTS/outbox.md"
fi
