#!/usr/bin/env bash
# make bench's growth section (issue 23): how the cost moves as the work
# grows, on a throwaway cluster of its own; writes
# tests/bench/results/growth.md, its plots and raw CSV.
#
#   bash tests/bench/growth.sh [quick|medium|full]     (make bench runs it too)
#
# Three curves and a probe, each against a baseline measured in the same run:
#   clients   cycle (pg_idem / the minimal floor's bare INSERT+UPDATE), replay
#             (pg_idem / a bare primary-key SELECT of the same rows) and a hot
#             key (every client the same completed key: replays / the bare
#             SELECT of it) at 1, 4, 16, 64 and 128 clients, variants
#             interleaved within each round
#   shapes    the replay's call shapes by server CPU per call (the one the
#             clients send, a composite value, a subquery) / the bare SELECT
#   pile-up   the claim's p50/p99 with N keys in idem_keys, quiet and then
#             while idem_cleanup deletes a backlog of N/2 keys past their
#             horizon at full speed (one session calling it back to back
#             until the backlog is gone), and beside two controls: a session
#             that only burns CPU as long, and one that only writes as much
#             WAL; the cleanup's throughput in keys/s, the WAL of each phase
#             and what the claims wait on
#   pacing    the claim's p50/p99 with 1 M keys (and 10 M but in quick mode) while
#             the cleanup worker itself deletes a backlog of half as many at
#             each idem.cleanup_delay of PACING_DELAYS (0 100 200; full mode
#             also 25 and 50), against the quiet
#             cycle of the same round, and the worker's keys/s
#   wake-up   followers 1, 10 and 100 waiting in the database for one
#             winner, directly and through PgBouncer (transaction mode,
#             pool 5): time from the winner's finalize to each follower's
#             answer, p50/p99 (tests/bench/growth_wakeup.py), and what the
#             harness itself adds to it at 100 followers
# GROWTH_PARTS names the parts to measure (default: "clients shapes pileup
# pacing wakeup"); the page keeps the committed numbers of a part left out
# (results/raw/growth/), and its machine lines say which run they are from.
# The steady-state size under a short idem.ttl is the main section's
# (tests/bench/run.sh): it stays there.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/tests/bench
RESULTS=$BENCH/results
. "$ROOT/tests/lib.sh"
. "$ROOT/tests/pooling/pgbouncer.sh"

MODE=${1:-quick}
case $MODE in
    quick)  ROUNDS=2 SECS=2 SHAPE_CALLS=30000 PILE_SECS=5 SIZES="100000 1000000" WAKE_ROUNDS=5
            PACE_SIZES=1000000 PACE_DELAYS="0 100 200" ;;
    # medium and full pace 10 M keys too: issue 35's bound is at 1 M and 10 M.
    medium) ROUNDS=3 SECS=3 SHAPE_CALLS=100000 PILE_SECS=10 SIZES="1000000 3000000" WAKE_ROUNDS=10
            PACE_SIZES="1000000 10000000" PACE_DELAYS="0 100 200" ;;
    full)   ROUNDS=3 SECS=10 SHAPE_CALLS=300000 PILE_SECS=30 SIZES="1000000 10000000" WAKE_ROUNDS=30
            PACE_SIZES="1000000 10000000" PACE_DELAYS="0 25 50 100 200" ;;
    *) echo "usage: $0 [quick|medium|full]" >&2; exit 2 ;;
esac
CLIENT_COUNTS=${GROWTH_CLIENTS:-"1 4 16 64 128"}
SIZES=${GROWTH_SIZES:-$SIZES}
ALL_PARTS="clients shapes pileup pacing wakeup"
PARTS=${GROWTH_PARTS:-$ALL_PARTS}
for p in $PARTS; do
    case " $ALL_PARTS " in *" $p "*) ;; *) echo "GROWTH_PARTS: no part $p (parts: $ALL_PARTS)" >&2; exit 2 ;; esac
done
measured() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# max_connections above the largest client count and its pooler; the
# horizons short so that the seeded backlog is past them (a key is deleted
# past max(idem.ttl, idem.tombstone_ttl)).
CLUSTER_CONF="shared_preload_libraries = 'pg_idem'
max_connections = 300
fsync = on
synchronous_commit = on
shared_buffers = ${GROWTH_SHARED_BUFFERS:-512MB}
max_wal_size = 8GB
checkpoint_timeout = 1h
autovacuum = on
idem.cleanup_worker = off
idem.ttl = '1h'
idem.tombstone_ttl = '1h'
jit = off"

PGHOST=${PGHOST:-} PGPORT=${PGPORT:-} PGUSER=${PGUSER:-} PGDATABASE=${PGDATABASE:-}
client() { PATH="$PG_BIN:$PATH" "$@"; }
q() { client psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

START_TIME=$(date +%s)
install_missing_packages gnuplot-nox bc
make_workdir bench-growth
build_and_install_extension "$ROOT"
start_cluster "$CLUSTER_CONF"
SCRIPTS=$BENCH/scripts
OUT=$WORK/growth
mkdir -p "$OUT"
q -c "CREATE EXTENSION pg_idem" -f "$BENCH/sql/setup.sql" -f "$BENCH/sql/growth.sql" >/dev/null
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "mode=$MODE rounds=$ROUNDS secs=$SECS pile_secs=$PILE_SECS sizes=$SIZES"
    echo "nproc=$(nproc)"
    echo "postgres=$(q -c 'SELECT version()')"
    echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "parts=$PARTS"
    echo "shared_buffers=$(q -c 'SHOW shared_buffers')"
    if measured pacing; then
        echo "pacing_sizes=${PACING_SIZES:-$PACE_SIZES} pacing_delays=${PACING_DELAYS:-$PACE_DELAYS} pacing_interval=${PACING_INTERVAL:-1s}"
    fi
} >"$OUT/machine.txt"
# The parts left out: the committed page's numbers, and the run they are from.
kept=
for p in $ALL_PARTS; do
    if ! measured "$p" && [ -f "$RESULTS/raw/growth/$p.csv" ]; then
        cp "$RESULTS/raw/growth/$p.csv" "$OUT/$p.csv"
        [ "$p" = wakeup ] && [ -f "$RESULTS/raw/growth/wakeup_harness.csv" ] &&
            cp "$RESULTS/raw/growth/wakeup_harness.csv" "$OUT/"
        [ "$p" = pileup ] && [ -f "$RESULTS/raw/growth/pileup_waits.csv" ] &&
            cp "$RESULTS/raw/growth/pileup_waits.csv" "$OUT/"
        [ "$p" = pacing ] && [ -f "$RESULTS/raw/growth/pacing_buffers.csv" ] &&
            cp "$RESULTS/raw/growth/pacing_buffers.csv" "$OUT/"
        kept="$kept $p"
    fi
done
# (appended to machine.txt after this run's own lines, at the end)
: >"$WORK/kept.txt"
if [ -n "$kept" ] && [ -f "$RESULTS/raw/growth/machine.txt" ]; then
    echo "kept from an earlier run:$kept" >"$WORK/kept.txt"
    sed 's/^/earlier run: /' "$RESULTS/raw/growth/machine.txt" >>"$WORK/kept.txt"
fi

# One pgbench run; prints "tps,p50_us,p99_us" from its per-transaction log.
pgbench_run() {   # CLIENTS SECS SCRIPT [ARGS...]
    local clients=$1 secs=$2 script=$3 dir
    shift 3
    dir=$(mktemp -d "$WORK/run.XXXX")
    client pgbench -n -M prepared -T "$secs" -c "$clients" -j $((clients < 2 ? clients : 2)) \
        --log --log-prefix="$dir/log" -f "$SCRIPTS/$script.sql" "$@" >"$dir/out" 2>&1 || true
    local tps
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$dir/out" | head -1)
    { cat "$dir"/log.* 2>/dev/null || true; } | awk '$3 ~ /^[0-9]+$/ {print $3}' | sort -n |
        awk -v tps="${tps:-0}" '{a[NR] = $1} END {
            if (NR) printf "%s,%d,%d\n", tps, a[int(NR * 0.50 + 0.5)], a[int(NR * 0.99 + 0.5)];
            else printf "%s,0,0\n", tps }'
    rm -rf "$dir"
}

# ---------------------------------------------------------------------------
cell() {   # ROUND SCENARIO VARIANT CLIENTS
    case $2 in
        cycle) q -c "SELECT bench.reset('$([ "$3" = minimal ] && echo bench.idem_minimal || echo idem_keys)', 'none', 0)" >/dev/null ;;
    esac
    echo "$1,$2,$3,$4,$(pgbench_run "$4" "$SECS" "$2-$3")" >>"$OUT/clients.csv"
}
# The two variants of one point run back to back, their order turning
# each round, so that the machine's drift hits both alike.
pair() {   # ROUND SCENARIO CLIENTS BASE
    if [ $(($1 % 2)) = 1 ]; then
        cell "$1" "$2" pg_idem "$3"; cell "$1" "$2" "$4" "$3"
    else
        cell "$1" "$2" "$4" "$3"; cell "$1" "$2" pg_idem "$3"
    fi
}
if measured clients; then
say "clients: cycle, replay and a hot key at $CLIENT_COUNTS clients ($ROUNDS rounds x ${SECS}s)"
echo "round,scenario,variant,clients,tps,p50_us,p99_us" >"$OUT/clients.csv"
for round in $(seq 1 "$ROUNDS"); do
    for clients in $CLIENT_COUNTS; do
        pair "$round" cycle "$clients" minimal
        # Replays read 10,000 completed keys of idem_keys (the floor reads
        # the same rows); the hot key is the first of them.
        q -c "SELECT bench.reset('idem_keys', 'completed', 10000)" -c "VACUUM ANALYZE idem_keys" >/dev/null
        pair "$round" replay "$clients" floor
        pair "$round" hotreplay "$clients" floor
    done
    echo "round $round of $ROUNDS done ($(($(date +%s) - START_TIME)) s)"
done
fi

# ---------------------------------------------------------------------------
# The replay's call shapes, by the server's CPU per call (what the shape
# itself costs; one client, a fixed number of calls, the postmaster's
# reaped children's CPU time read around each run): SELECT * FROM
# idem_claim(...) as the clients send it, one composite value, a subquery
# scan, and the bare primary-key SELECT.
if measured shapes; then
say "replay shapes: server CPU per call, $ROUNDS rounds x $SHAPE_CALLS calls"
echo "round,shape,calls,cpu_ticks,ticks_per_s" >"$OUT/shapes.csv"
POSTMASTER=$(head -1 "$WORK/data/postmaster.pid")
reaped_cpu() { awk '{print $16 + $17}' "/proc/$POSTMASTER/stat"; }
q -c "SELECT bench.reset('idem_keys', 'completed', 10000)" -c "VACUUM ANALYZE idem_keys" >/dev/null
for round in $(seq 1 "$ROUNDS"); do
    for shape in replay-floor replay-pg_idem replayshape-composite replayshape-subquery; do
        c0=$(reaped_cpu)
        client pgbench -n -M prepared -t "$SHAPE_CALLS" -c 1 -f "$SCRIPTS/$shape.sql" >/dev/null 2>&1 || true
        # The backend is reaped a moment after pgbench exits.
        for _ in $(seq 1 50); do
            [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")" = 1 ] && break
            sleep 0.1
        done
        sleep 0.2
        echo "$round,$shape,$SHAPE_CALLS,$(($(reaped_cpu) - c0)),$(getconf CLK_TCK)" >>"$OUT/shapes.csv"
    done
done
fi

# ---------------------------------------------------------------------------
if measured pileup; then
say "pile-up: the claim's latency with $SIZES keys: quiet, beside a CPU burner, during cleanup"
echo "keys,phase,tps,p50_us,p99_us,deleted,cleanup_keys_per_s,table_mb,indexes_mb,wal_mb,wal_fpi" >"$OUT/pileup.csv"
echo "keys,phase,wait,samples" >"$OUT/pileup_waits.csv"
size() { q -c "SELECT round(pg_relation_size('idem_keys') / 1048576.0, 1) || ',' ||
                      round(pg_indexes_size('idem_keys') / 1048576.0, 1)"; }
wal_now() { q -c "SELECT pg_current_wal_lsn() - '0/0' || ',' || wal_fpi FROM pg_stat_wal"; }
# One phase: the claim cycle at 4 clients for PILE_SECS, the claims'
# backends sampled meanwhile (bench.sample_waits), beside
#   quiet    nothing else;
#   cpu      bench.burn_cpu: one backend spinning for as long, writing
#            nothing (the cleanup's share of a core, and nothing else of it);
#   cleanup  idem_cleanup(10000) back to back until it finds nothing left or
#            the cycle's run is over; its rate is what it deleted over the
#            time it ran, and CLEANUP_WAL_RATE the WAL the cluster wrote
#            meanwhile (MB/s);
#   wal      bench.write_wal: as much WAL per second as the cleanup's added
#            to the quiet phase's, and nothing else (the cleanup's WAL
#            without its deletes).
# The WAL the phase wrote (all sessions), and its full-page images.
lsn_now() { q -c "SELECT pg_current_wal_lsn() - '0/0'"; }
pile_phase() {   # KEYS PHASE
    local n=$1 phase=$2 cycler sampler t0 t1 got deleted=0 rate=0 w0 w1 l0 l1
    w0=$(wal_now)
    pgbench_run 4 "$PILE_SECS" cycle-pg_idem >"$WORK/pile.result" &
    cycler=$!
    q -F, -c "SELECT $n, '$phase', wait, samples FROM bench.sample_waits($PILE_SECS - 0.5)" \
        >>"$OUT/pileup_waits.csv" &
    sampler=$!
    t0=$(date +%s.%N)
    case $phase in
        cpu) q -c "SELECT bench.burn_cpu($PILE_SECS)" >/dev/null ;;
        wal) q -c "SELECT bench.write_wal($WAL_RATE, $PILE_SECS)" >/dev/null ;;
        cleanup)
            l0=$(lsn_now)
            while kill -0 "$cycler" 2>/dev/null; do
                got=$(q -c "SELECT idem_cleanup(10000)")
                deleted=$((deleted + got))
                [ "$got" -gt 0 ] || break
            done
            l1=$(lsn_now) ;;
    esac
    t1=$(date +%s.%N)
    [ "$phase" = cleanup ] &&
        CLEANUP_WAL_RATE=$(echo "$l0 $l1 $t0 $t1" | awk '{printf "%.2f", ($2 - $1) / 1048576 / ($4 - $3)}')
    wait "$cycler" || true
    wait "$sampler" || true
    [ "$deleted" -gt 0 ] && rate=$(echo "scale=0; $deleted / ($t1 - $t0)" | bc)
    sleep 1   # the exited backends' WAL counters reach pg_stat_wal
    w1=$(wal_now)
    echo "$n,$phase,$(cat "$WORK/pile.result"),$deleted,$rate,$(size),$(echo "${w0%,*} ${w1%,*}" |
        awk '{printf "%.1f", ($2 - $1) / 1048576}'),$((${w1#*,} - ${w0#*,}))" >>"$OUT/pileup.csv"
}
for n in $SIZES; do
    q -c "SELECT bench.growth_seed($n, $((n / 2)))" -c "VACUUM ANALYZE idem_keys" -c "CHECKPOINT" >/dev/null
    pile_phase "$n" quiet
    QUIET_WAL_RATE=$(tail -1 "$OUT/pileup.csv" | awk -F, -v s="$PILE_SECS" '{printf "%.2f", $10 / s}')
    pile_phase "$n" cpu
    pile_phase "$n" cleanup
    WAL_RATE=$(echo "$CLEANUP_WAL_RATE $QUIET_WAL_RATE" | awk '{r = $1 - $2; printf "%.2f", (r > 0 ? r : 0)}')
    pile_phase "$n" wal
    q -c "TRUNCATE idem_keys" >/dev/null
done
fi

# ---------------------------------------------------------------------------
# Pacing (issue 35): the claim cycle at 4 clients while the cleanup worker
# itself deletes the backlog, at each idem.cleanup_delay of PACING_DELAYS
# (ms; idem.cleanup_batch at its default, 1000; a pass every second, of at
# most 100 batches), and quiet (no worker), the phases' order turning each
# round so that the machine's drift hits them alike; the report divides
# each phase's p99 by its own round's quiet one.  Every phase starts from
# the same backlog: what the last one deleted is put back
# (bench.growth_refill), its dead rows vacuumed away and the buffers
# written out (CHECKPOINT), so that no phase pays for the last one's
# writes (the first run had the quiet phase after a refill slowest).  The worker's
# keys/s is idem_stats' cleanup_deleted over the phase.  A phase DELAY:BATCH
# also sets idem.cleanup_batch (e.g. PACING_DELAYS="200 20:100": the same
# keys/s in bursts a tenth the size), reset after the phase.
if measured pacing; then
PACING_SIZES=${PACING_SIZES:-$PACE_SIZES}
PACING_DELAYS=${PACING_DELAYS:-$PACE_DELAYS}
for d in $PACING_DELAYS; do
    case $d in
        *[!0-9:]* | :* | *: | *:*:*) echo "PACING_DELAYS: $d is not DELAY or DELAY:BATCH (ms)" >&2; exit 2 ;;
    esac
done
PACING_SECS=${PACING_SECS:-$PILE_SECS}
PACING_ROUNDS=${PACING_ROUNDS:-$ROUNDS}
say "pacing: the claims while the worker cleans at idem.cleanup_delay $PACING_DELAYS ms ($PACING_SIZES keys, $PACING_ROUNDS rounds x ${PACING_SECS}s)"
echo "keys,round,delay_ms,tps,p50_us,p99_us,deleted,cleanup_keys_per_s" >"$OUT/pacing.csv"
# What each phase did to the buffers (the lead for the 10 M-key miss): the
# blocks read into shared_buffers, and the dirty ones written out by whoever
# needed a free buffer (a backend: the claims or the worker; the background
# writer), from pg_stat_database and pg_stat_bgwriter (pg_stat_io's since 17).
echo "keys,round,delay_ms,blks_read,blks_hit,buffers_backend,buffers_clean" >"$OUT/pacing_buffers.csv"
deleted_so_far() { q -c "SELECT value FROM idem_stats WHERE counter = 'cleanup_deleted'"; }
buffer_counters() {
    local backend_writes="(to_jsonb(b) ->> 'buffers_backend')::bigint"
    [ "$(q -c 'SHOW server_version_num')" -lt 170000 ] ||
        backend_writes="(SELECT sum(writes) FROM pg_stat_io
                          WHERE backend_type NOT IN ('background writer', 'checkpointer'))::bigint"
    q -F, -c "SELECT d.blks_read, d.blks_hit, $backend_writes, b.buffers_clean
                FROM pg_stat_database d, pg_stat_bgwriter b WHERE d.datname = current_database()"
}
pacing_phase() {   # KEYS ROUND DELAY_MS[:BATCH]|quiet
    local n=$1 round=$2 delay=$3 d0 d1 t0 t1 b0 b1 result batch=
    d0=$(deleted_so_far)
    case $delay in *:*) batch=${delay#*:} ;; esac
    [ -z "$batch" ] || q -c "ALTER SYSTEM SET idem.cleanup_batch = $batch" >/dev/null
    [ "$delay" = quiet ] ||
        q -c "ALTER SYSTEM SET idem.cleanup_delay = '${delay%%:*}ms'" \
          -c "ALTER SYSTEM SET idem.cleanup_worker = on" -c "SELECT pg_reload_conf()" >/dev/null
    q -c "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1 || true
    b0=$(buffer_counters)
    t0=$(date +%s.%N)
    result=$(pgbench_run 4 "$PACING_SECS" cycle-pg_idem)
    if [ "$delay" != quiet ]; then
        q -c "ALTER SYSTEM SET idem.cleanup_worker = off" -c "ALTER SYSTEM RESET idem.cleanup_batch" \
          -c "SELECT pg_reload_conf()" \
          -c "SELECT pg_terminate_backend(pid, 60000) FROM pg_stat_activity
               WHERE backend_type = 'pg_idem cleanup'" >/dev/null
    fi
    t1=$(date +%s.%N)
    b1=$(buffer_counters)
    echo "$n,$round,$delay,$(paste -d' ' <(tr , '\n' <<<"$b0") <(tr , '\n' <<<"$b1") | awk '{printf "%s%d", (NR > 1 ? "," : ""), $2 - $1}')" \
        >>"$OUT/pacing_buffers.csv"
    d1=$(deleted_so_far)
    echo "$n,$round,$delay,$result,$((d1 - d0)),$(echo "scale=0; ($d1 - $d0) / ($t1 - $t0)" | bc)" \
        >>"$OUT/pacing.csv"
    [ $((d1 - d0)) = 0 ] || q -c "SELECT bench.growth_refill($((n / 2)))" >/dev/null
    # Whatever the refill and the phase left to write, written before the next.
    q -c "VACUUM idem_keys" -c "CHECKPOINT" >/dev/null
}
# PACING_INTERVAL: idem.cleanup_interval during the phases (1s: a pass
# starts within a second of the phase's start; production's default is 60s).
q -c "ALTER SYSTEM SET idem.cleanup_interval = '${PACING_INTERVAL:-1s}'" -c "SELECT pg_reload_conf()" >/dev/null
for n in $PACING_SIZES; do
    q -c "SELECT bench.growth_seed($n, $((n / 2)))" -c "VACUUM ANALYZE idem_keys" -c "CHECKPOINT" >/dev/null
    phases="quiet $PACING_DELAYS"
    for round in $(seq 1 "$PACING_ROUNDS"); do
        for phase in $phases; do pacing_phase "$n" "$round" "$phase"; done
        phases="${phases#* } ${phases%% *}"
        echo "pacing at $n keys: round $round of $PACING_ROUNDS done ($(($(date +%s) - START_TIME)) s)"
    done
    q -c "TRUNCATE idem_keys" >/dev/null
done
# This run's pacing, for make bench's targets table (run.sh passes GROWTH_COPY;
# the results' raw/growth/ may still hold an earlier run's).
[ -z "${GROWTH_COPY:-}" ] || { mkdir -p "$GROWTH_COPY" && cp "$OUT/pacing.csv" "$GROWTH_COPY/"; }
q -c "ALTER SYSTEM RESET idem.cleanup_interval" -c "ALTER SYSTEM RESET idem.cleanup_delay" \
  -c "ALTER SYSTEM RESET idem.cleanup_worker" -c "SELECT pg_reload_conf()" >/dev/null
fi

# ---------------------------------------------------------------------------
if measured wakeup; then
say "wake-up: 1, 10 and 100 followers, directly and through PgBouncer (pool 5)"
PGBOUNCER_POOL_SIZE=5 start_pgbouncer || { echo "PgBouncer did not start: wake-up through it not measured"; PGBOUNCER_PORT=; }
WAKE_ARGS=(--rounds "$WAKE_ROUNDS" --followers 1 10 100 --direct "host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=$PGUSER")
[ -n "${PGBOUNCER_PORT:-}" ] &&
    WAKE_ARGS+=(--pooled "host=127.0.0.1 port=$PGBOUNCER_PORT dbname=$PGDATABASE user=$PGUSER")
/usr/bin/python3 "$BENCH/growth_wakeup.py" "${WAKE_ARGS[@]}" >"$OUT/wakeup.csv" ||
    echo "the wake-up measurement failed (exit $?)" >&2
# What a harness adds: 100 followers, directly, as the first version of the
# harness measured them (a thread and a new connection each), on new
# connections from one thread, and as above.
/usr/bin/python3 "$BENCH/growth_wakeup.py" --rounds "$WAKE_ROUNDS" --followers 100 --harness threads fresh loop \
    --direct "host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=$PGUSER" >"$OUT/wakeup_harness.csv" ||
    echo "the harness comparison failed (exit $?)" >&2
stop_pgbouncer
fi

{
    echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "wall_seconds=$(($(date +%s) - START_TIME))"
    cat "$WORK/kept.txt"
} >>"$OUT/machine.txt"
stop_cluster
say "report"
python3 "$BENCH/growth_report.py" "$OUT" "$RESULTS" "$BENCH/plots"
