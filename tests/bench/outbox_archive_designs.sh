#!/usr/bin/env bash
# What a redesign of the outbox's archive would write (issue 35's WAL
# target: the archive on, WAL per consumed event <= 1.3 x pgmq's): three
# designs in plain SQL on tables of idem_outbox_queue's shape
# (tests/bench/sql/archive_designs.sql), one client's life of 20000
# events staged by 100, claimed and acked by 100, WAL per event from the
# WAL position before and after.  WAL bytes do not depend on the
# machine's load, so one run is the measurement.  Writes
# tests/bench/results/outbox_archive_designs.md.
#
#   bash tests/bench/outbox_archive_designs.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tests/bench
RESULTS=$BENCH/results
. "$ROOT/tests/lib.sh"

make_workdir bench-archive-designs
build_and_install_extension "$ROOT"
start_cluster "shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
max_wal_size = 4GB
checkpoint_timeout = 1h
autovacuum = off"
q() { PATH="$PG_BIN:$PATH" psql -X -q -At -F '|' -v ON_ERROR_STOP=1 "$@"; }
# The designs' tables are copies of pg_idem's own (LIKE).
q -c "CREATE EXTENSION pg_idem"

ROWS=$WORK/rows
: >"$ROWS"
run() {   # DESIGN ARCHIVE FILLFACTOR LABEL
    q -v design="$1" -v archive="$2" -v ff="$3" -v label="$4" -f "$BENCH/sql/archive_designs.sql" >>"$ROWS"
}
run floor off 100 "pgmq's shape (read, delete): the baseline"
run today off 100 "0.6.0, idem.outbox_archive = off"
run today on 100 "0.6.0, idem.outbox_archive = on (the default): the ack copies the event"
for ff in 100 70 50; do
    run inflight on "$ff" "in flight: the claim moves the event, the ack marks it (fillfactor $ff)"
done

base=$(head -1 "$ROWS" | cut -d'|' -f2)
{
    echo "# The outbox's archive: what each design writes"
    echo
    echo "Written by \`tests/bench/outbox_archive_designs.sh\` ($(date -u '+%Y-%m-%d'), $(q -c 'SHOW server_version'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)): one client stages 20000 events by 100, then claims and acks them by 100, in plain SQL on tables of idem_outbox_queue's shape (`tests/bench/sql/archive_designs.sql`). Bytes of WAL per event; *× pgmq* is the life's WAL over pgmq's shape's (issue 35's target for the archive: ≤ 1.3)."
    echo
    echo "| design | WAL per event, stage to ack | stage | drain | × pgmq | left unconsumed | kept as published |"
    echo "|---|---|---|---|---|---|---|"
    while IFS='|' read -r label total stage drain left kept; do
        echo "| $label | $total B | $stage B | $drain B | $(printf '%.2f' "$(echo "scale=4; $total / $base" | bc)") | $left | $kept |"
    done <"$ROWS"
    echo
    echo "In flight, the claim's move (the queue row's delete, the in-flight row's insert and its two index entries) writes about what 0.6.0's claim writes (a new version of the row on another page and its two index entries); the ack's update stays on the row's page when the page has room, so its record carries the changed bytes only and no copy of the event. At fillfactor 100 the page has no room and the ack writes the whole row again: the in-flight table's free space is what the design buys, and it costs the queue's staging nothing (the queue keeps fillfactor 100; see docs/benchmarks.md#the-outbox for what fillfactor costs staging)."
} >"$RESULTS/outbox_archive_designs.md"
cat "$RESULTS/outbox_archive_designs.md"
