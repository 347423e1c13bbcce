#!/usr/bin/env bash
# make bench's outbox probe by instruction count (issue 23): what each
# outbox cell costs the server per event, pg_idem against pgmq, counted by valgrind's callgrind in a single-user backend, so
# that neither the machine's other load nor its disk moves the numbers
# (instructions, not seconds: the same binary and inputs count the same).
#
#   bash tests/bench/outbox_instructions.sh            (PGMQ_SQL as outbox.sh)
#
# Per cell and variant the backend runs the cell's statement (prepared,
# as pgbench -M prepared sends it) M and then 2 M times, after the same
# warm-up, from the same seeded start; the difference of the two counts is M statements' cost,
# start-up, seeding and the cache warm-up cancelled out.  Cells: stage 1
# and stage 100 per statement; claim + ack of 1 and of 100 (claim and ack
# in one statement here: the probe counts work, not commits).  Writes
# tests/bench/results/outbox_instructions.md and raw/outbox_instructions.csv.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tests/bench
RESULTS=$BENCH/results
. "$ROOT/tests/lib.sh"

M=${OUTBOX_PROBE_STATEMENTS:-20}
WARMUP=6
PAYLOAD=$(sed -n "s/.*'\({.*}\)'::jsonb.*/\1/p" "$BENCH/outbox/stage1-floor.sql")

make_workdir bench-outbox-ir
build_and_install_extension "$ROOT"
# wal_init_zero off: a single-user backend creates its WAL segments
# itself, and zero-filling one (16 MB) would land in whichever run
# crosses a segment boundary.
start_cluster "shared_preload_libraries = 'pg_idem'
wal_init_zero = off
max_wal_size = 4GB
checkpoint_timeout = 1h
idem.cleanup_worker = off
autovacuum = off
jit = off"
client() { PATH="$PG_BIN:$PATH" "$@"; }
q() { client psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
VARIANTS="pg_idem pg_idem_noarch"
q -c "CREATE EXTENSION pg_idem"
PGMQ_NAME="not run"
if [ -n "${PGMQ_SQL:-}" ] && [ -f "$PGMQ_SQL" ]; then
    q -f "$PGMQ_SQL" >/dev/null && q -c "SELECT pgmq.create('bench')" >/dev/null &&
        VARIANTS="$VARIANTS pgmq"
    PGMQ_COMMIT=${PGMQ_COMMIT:-$(git -C "$(dirname "$PGMQ_SQL")" rev-parse HEAD 2>/dev/null || true)}
    PGMQ_NAME="$(sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" \
        "$(dirname "$PGMQ_SQL")/../pgmq.control" 2>/dev/null || true)${PGMQ_COMMIT:+, commit $PGMQ_COMMIT}"
fi
# A clean shutdown: stop_cluster's immediate one would leave the first
# probe a crash recovery to count.
as_run_user "$PG_BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null

# The statement of a cell for a variant; $1 cell, $2 variant.
statement() {
    local n=${1#stage} batch=${1#drain}
    case $1:$2 in
        stage1:pg_idem*) echo "SELECT idem_outbox_stage('orders', '$PAYLOAD'::jsonb)" ;;
        stage100:pg_idem*) echo "SELECT count(*) FROM idem_outbox_stage_batch('orders', array_fill('$PAYLOAD'::jsonb, ARRAY[$n]))" ;;
        stage1:pgmq) echo "SELECT * FROM pgmq.send('bench', '$PAYLOAD'::jsonb)" ;;
        stage100:pgmq) echo "SELECT count(*) FROM pgmq.send_batch('bench', array_fill('$PAYLOAD'::jsonb, ARRAY[$n]))" ;;
        drain*:pg_idem*) echo "SELECT idem_outbox_ack(t, ids) FROM (SELECT (array_agg(claim_token))[1] AS t, array_agg(id) AS ids FROM idem_outbox_claim($batch, '30 s')) c" ;;
        drain*:pgmq) echo "SELECT count(*) FROM pgmq.delete('bench', ARRAY(SELECT msg_id FROM pgmq.read('bench', 30, $batch)))" ;;
    esac
}

# What a cell's run starts from: an empty queue, or one seeded with enough
# claimable events for 2 M statements.
seed() {   # CELL VARIANT
    local rows=0
    case $1 in drain*) rows=$(((2 * M + WARMUP) * ${1#drain})) ;; esac
    case $2 in
        pg_idem*) echo "TRUNCATE idem_outbox_queue, idem_outbox_claimed;"
                  [ "$rows" -gt 0 ] && echo "INSERT INTO idem_outbox_queue (topic, payload, available_at, scope) SELECT 'orders', '$PAYLOAD', clock_timestamp(), current_user::regrole FROM generate_series(1, $rows);" ;;
        pgmq) echo "TRUNCATE pgmq.q_bench, pgmq.a_bench;"
              [ "$rows" -gt 0 ] && echo "INSERT INTO pgmq.q_bench (vt, message) SELECT clock_timestamp(), '$PAYLOAD' FROM generate_series(1, $rows);" ;;
    esac
    case $2 in
        pg_idem*) echo "VACUUM ANALYZE idem_outbox_queue;" ;;
        pgmq) echo "VACUUM ANALYZE pgmq.q_bench;" ;;
    esac
    echo "CHECKPOINT;"
    true
}

# Instructions of one single-user backend running the cell's statement N times.
count() {   # CELL VARIANT N
    local sql=$WORK/probe.sql out=$WORK/callgrind.out
    {
        seed "$1" "$2"
        [ "$2" = pg_idem_noarch ] && echo "SET idem.outbox_archive = off;"
        echo "PREPARE probe AS $(statement "$1" "$2");"
        # Warm-up, in both runs: the caches, and the plan cache's switch to
        # a generic plan after five custom ones.
        for _ in $(seq 1 $((WARMUP + $3))); do echo "EXECUTE probe;"; done
    } >"$sql"
    chmod 644 "$sql"
    rm -f "$out"
    as_run_user valgrind --tool=callgrind --callgrind-out-file="$out" --trace-children=no \
        "$PG_BIN/postgres" --single -D "$WORK/data" postgres <"$sql" >"$WORK/probe.log" 2>&1 ||
        { tail -20 "$WORK/probe.log"; echo "probe failed: $1 $2" >&2; exit 1; }
    grep -q "ERROR" "$WORK/probe.log" && { grep -m3 ERROR "$WORK/probe.log"; exit 1; }
    sed -n 's/^summary: //p' "$out"
}

OUT=$WORK/outbox_instructions.csv
echo "cell,variant,events,instructions" >"$OUT"
say "outbox instructions per event (callgrind, $M and $((2 * M)) statements per cell)"
for cell in stage1 stage100 drain1 drain100; do
    per=1
    case $cell in stage100|drain100) per=100 ;; esac
    for v in $VARIANTS; do
        a=$(count "$cell" "$v" "$M")
        b=$(count "$cell" "$v" $((2 * M)))
        echo "$cell,$v,$((M * per)),$((b - a))" >>"$OUT"
        printf '  %-9s %-15s %8.0f instructions per event\n' "$cell" "$v" "$(echo "($b - $a) / ($M * $per)" | bc -l)"
    done
done
mkdir -p "$RESULTS/raw"
cp "$OUT" "$RESULTS/raw/outbox_instructions.csv"
python3 - "$OUT" "$RESULTS/outbox_instructions.md" "$M" "$PGMQ_NAME" "$("$PG_BIN/postgres" --version)" <<'EOF'
import csv, sys
path, md, m, pgmq, version = sys.argv[1:6]
rows = list(csv.DictReader(open(path)))
per = {(r["cell"], r["variant"]): int(r["instructions"]) / int(r["events"]) for r in rows}
variants = [v for v in ("pg_idem", "pg_idem_noarch", "pgmq") if any(k[1] == v for k in per)]
label = {"pg_idem": "pg_idem (archive)", "pg_idem_noarch": "pg_idem (no archive)",
         "floor": "floor (pgmq's shape)", "pgmq": "pgmq"}
title = {"stage1": "stage, 1 event per statement", "stage100": "stage, 100 events per statement",
         "drain1": "claim + ack, batch 1", "drain100": "claim + ack, batch 100"}
out = ["# Outbox: server instructions per event\n",
       "Generated by `tests/bench/outbox_instructions.sh` (part of `make bench`): callgrind's "
       "instruction count of a single-user backend (%s) running each cell's prepared "
       "statement %s and %d times from the same seeded start; the difference is the cost of "
       "%s statements. Instructions, not seconds: neither the machine's other load nor its disk "
       "moves them. pgmq: %s.\n" % (version, m, 2 * int(m), m, pgmq),
       "| cell | " + " | ".join(label[v] for v in variants) +
       (" | pgmq / pg_idem (no archive) | pgmq / pg_idem (archive) |" if "pgmq" in variants else " |"),
       "|" + "---|" * (len(variants) + 1 + (2 if "pgmq" in variants else 0))]
for cell in ("stage1", "stage100", "drain1", "drain100"):
    row = [title[cell]] + ["%.0f" % per[(cell, v)] for v in variants]
    if "pgmq" in variants:
        row += ["%.2f" % (per[(cell, "pgmq")] / per[(cell, "pg_idem_noarch")]),
                "%.2f" % (per[(cell, "pgmq")] / per[(cell, "pg_idem")])]
    out.append("| " + " | ".join(row) + " |")
out.append("\nThe ratio columns are pg_idem's speed-up by instructions: pgmq's count over "
           "pg_idem's (≥ 1.1 is issue 23's target for every cell).")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
echo "outbox instruction counts: $RESULTS/outbox_instructions.md"
