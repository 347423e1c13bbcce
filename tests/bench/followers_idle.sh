#!/usr/bin/env bash
# What followers waiting in the server cost while they wait (issue 14's
# target: 100 followers waiting 5 s cost no measurable backend CPU).
#
#   bash tests/bench/followers_idle.sh [FOLLOWERS] [SECONDS]
#
# On a throwaway cluster (pg_idem preloaded): a winner claims a key with a
# long lease; FOLLOWERS sessions call idem_claim(..., max_wait => SECONDS)
# on it and sleep in the server; their backends' CPU (utime + stime from
# /proc) is read when they are all asleep and again when their waits end.
# For comparison, the same number of sessions poll idem_lookup every 50 ms
# for the same time.  Prints one line per variant: total backend CPU in ms,
# and per follower per second.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/tests/lib.sh"

N=${1:-100}
SECS=${2:-5}

install_missing_packages bc
make_workdir followers
build_and_install_extension "$ROOT"
start_cluster "shared_preload_libraries = 'pg_idem'
max_connections = $((N + 20))"

psql_q() { as_run_user psql -X -q -A -t -v ON_ERROR_STOP=1 "$@"; }
psql_q -c "CREATE EXTENSION pg_idem" >/dev/null
psql_q -c "SELECT outcome FROM idem_claim(idem_key('bench', 'POST', '/idle', 'k'),
                                          idem_request_hash('b'), '1 hour')" >/dev/null
TICKS=$(getconf CLK_TCK)

# Sum of utime + stime (clock ticks) of the backends whose query matches $1.
cpu_ticks() {
    local pids pid total=0
    pids=$(psql_q -c "SELECT pid FROM pg_stat_activity WHERE query LIKE '%$1%'
                        AND pid <> pg_backend_pid()")
    for pid in $pids; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}

# Wait until $2 backends whose query matches $1 are in wait event class $3.
wait_for() {
    for _ in $(seq 200); do
        [ "$(psql_q -c "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%$1%'
                          AND wait_event_type = '$3' AND pid <> pg_backend_pid()")" -ge "$2" ] && return
        sleep 0.05
    done
    echo "followers_idle: the sessions never all waited" >&2
    exit 1
}

report() {   # NAME TICKS
    awk -v name="$1" -v t="$2" -v hz="$TICKS" -v n="$N" -v s="$SECS" 'BEGIN {
        ms = t * 1000 / hz
        printf "%-34s %8.1f ms backend CPU in all, %6.3f ms per follower per second\n",
               name, ms, ms / n / (s - 1) }'
}

say "$N followers waiting in the server for ${SECS} s"
for i in $(seq "$N"); do
    psql_q -c "SELECT /* idle-wait */ outcome FROM idem_claim(idem_key('bench', 'POST', '/idle', 'k'),
               idem_request_hash('b'), NULL, '$SECS s')" >/dev/null &
done
wait_for idle-wait "$N" Extension
before=$(cpu_ticks idle-wait)
sleep "$((SECS - 1))"
after=$(cpu_ticks idle-wait)
wait
report "server-side wait (max_wait)" $((after - before))

say "$N followers polling idem_lookup every 50 ms for ${SECS} s"
for i in $(seq "$N"); do
    psql_q -c "DO \$\$ /* idle-poll */ BEGIN
                 FOR i IN 1 .. $((SECS * 20)) LOOP
                   PERFORM idem_lookup(idem_key('bench', 'POST', '/idle', 'k'), idem_request_hash('b'));
                   PERFORM pg_sleep(0.05);
                 END LOOP; END \$\$" >/dev/null &
done
wait_for idle-poll "$N" Timeout
before=$(cpu_ticks idle-poll)
sleep "$((SECS - 1))"
after=$(cpu_ticks idle-poll)
wait
report "polling every 50 ms (in the server)" $((after - before))
