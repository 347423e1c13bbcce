#!/usr/bin/env bash
# pg_idem under pg_auto_failover, by hand: a monitor and two nodes on this
# machine (Debian postgresql-15-auto-failover), claims and responses on the
# primary, the primary's machine lost (keeper killed, server stopped
# immediately), the monitor promotes the secondary; then the claims and
# responses are checked on the new primary through the formation's
# multi-host URI.  Prints the time until the formation accepts writes again.
#
#   bash tests/failover/pg_auto_failover.sh          (as root or a user with sudo)
#
# Not part of make test: it takes about a minute with the tuned health
# checks below (the defaults take 40 s for the failover alone), and the
# README records a run's result.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/tests/lib.sh"

make_workdir autofailover
build_and_install_extension "$ROOT" >/dev/null
W=$WORK
PGHOST=localhost PGPORT=5432 PGUSER=$(run_user) PGDATABASE=postgres
export PGHOST PGPORT PGUSER PGDATABASE   # PGPORT: unset again for pg_autoctl (ac)
mon_port=$(free_port) p1=$(free_port) p2=$(free_port)
MON="postgres://autoctl_node@localhost:$mon_port/pg_auto_failover?sslmode=disable"
URI="postgres://localhost:$p1,localhost:$p2/postgres?target_session_attrs=read-write&sslmode=disable&connect_timeout=2"

# pg_autoctl keeps its state under XDG directories: keep them in $WORK.
ac() {
    as_run_user env -u PGPORT HOME="$W" XDG_CONFIG_HOME="$W/xdg/config" XDG_DATA_HOME="$W/xdg/data" \
        XDG_RUNTIME_DIR="$W/xdg/run" "$@"
}
ac mkdir -p "$W/xdg/config" "$W/xdg/data" "$W/xdg/run"
pids=()
# The pg_autoctl process that the wrapper (runuser) started in the background.
keeper_of() {
    local i p
    for i in $(seq 1 20); do
        p=$(pgrep -P "$1" | head -1)
        [ -n "$p" ] && { echo "$p"; return; }
        sleep 0.2
    done
}
# A process and all its descendants (pg_autoctl's services are grandchildren:
# a surviving one restarts the server it supervises).
tree_of() {
    local c
    echo "$1"
    for c in $(pgrep -P "$1"); do tree_of "$c"; done
}
# Stop every pg_autoctl this script started (each stops its server), by pid.
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    done
}
trap 'rc=$?; cleanup; finish_workdir $rc' EXIT

# Wait until `pg_autoctl show state` matches $1 (at most $2 seconds).
wait_state() {
    local i
    for i in $(seq 1 "$2"); do
        ac pg_autoctl show state --pgdata "$W/monitor" 2>/dev/null | grep -qE "$1" && return 0
        sleep 1
    done
    ac pg_autoctl show state --pgdata "$W/monitor" || true
    return 1
}

say "monitor on port $mon_port"
ac pg_autoctl create monitor --pgctl "$PG_BIN/pg_ctl" --pgdata "$W/monitor" --pgport "$mon_port" \
    --hostname localhost --auth trust --no-ssl --run >"$W/monitor.log" 2>&1 &
pids+=("$(keeper_of $!)")
for i in $(seq 1 30); do
    ac psql "postgres://autoctl_node@localhost:$mon_port/pg_auto_failover" -Atc 'SELECT 1' >/dev/null 2>&1 && break
    sleep 1
done
# Faster health checks than the defaults (period 5 s, timeout 5 s, 2 retries
# 2 s apart, unhealthy after 20 s), so that a lost primary is noticed in
# seconds.
ac psql "postgres://localhost:$mon_port/pg_auto_failover" -q <<'SQL'
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000;
SELECT pg_reload_conf();
SQL

say "node 1 on port $p1, node 2 on port $p2"
ac pg_autoctl create postgres --pgctl "$PG_BIN/pg_ctl" --pgdata "$W/node1" --pgport "$p1" \
    --hostname localhost --auth trust --no-ssl --monitor "$MON" --run >"$W/node1.log" 2>&1 &
node1=$(keeper_of $!)
pids+=("$node1")
wait_state "node_1 .* single +\| +single" 60
ac pg_autoctl create postgres --pgctl "$PG_BIN/pg_ctl" --pgdata "$W/node2" --pgport "$p2" \
    --hostname localhost --auth trust --no-ssl --monitor "$MON" --run >"$W/node2.log" 2>&1 &
pids+=("$(keeper_of $!)")
wait_state "node_2 .* secondary +\| +secondary" 90
ac pg_autoctl show state --pgdata "$W/monitor"

say "claims and responses on the primary"
ac psql "$URI" -Atq <<'SQL'
SELECT 'synchronous_standby_names = ' || current_setting('synchronous_standby_names');
CREATE EXTENSION pg_idem;
CREATE TABLE acked (label text, claim_id uuid, generation bigint);
INSERT INTO acked SELECT n::text, c.claim_id, c.generation
  FROM generate_series(1, 200) n,
       LATERAL idem_claim(sha256(convert_to(n::text, 'UTF8')), sha256(convert_to(n::text, 'UTF8')), '1 hour') c;
SELECT 'finalized: ' || count(*) FILTER (WHERE idem_finalize(sha256(convert_to(label, 'UTF8')), claim_id, 201, NULL,
                                                             convert_to('body ' || label, 'UTF8')))
  FROM acked WHERE label::int <= 100;
SQL

say "losing node 1: its keeper killed, its server stopped immediately"
t0=$(date +%s.%N)
# The keeper and its service processes die at once, as with the machine.
for p in $(tree_of "$node1"); do
    [ "$(ps -o comm= -p "$p")" = pg_autoctl ] && kill -KILL "$p"
done
as_run_user "$PG_BIN/pg_ctl" -D "$W/node1" -m immediate stop >/dev/null
wait_state "node_2 .*\| +(wait_primary|primary) +\| +(wait_primary|primary)" 120
for i in $(seq 1 120); do
    ac timeout 5 psql "$URI" -Atc \
        'CREATE TABLE IF NOT EXISTS written_after (x int); INSERT INTO written_after VALUES (1)' \
        >/dev/null 2>&1 && break
    sleep 0.5
done
t1=$(date +%s.%N)
echo "the formation accepts writes again after $(echo "$t1 - $t0" | bc) s"
ac pg_autoctl show state --pgdata "$W/monitor"

ac psql "$URI" -At <<'SQL'
SELECT 'new primary: port ' || inet_server_port() || ', timeline ' ||
       ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int;
SELECT 'synchronous_standby_names = ''' || current_setting('synchronous_standby_names') || '''';
SELECT 'claims kept with their generation: ' || count(*) || ' of 200'
  FROM acked a JOIN idem_keys k ON k.cache_key = sha256(convert_to(a.label, 'UTF8')) AND k.generation = a.generation;
SELECT 'responses replayed byte for byte: ' || count(*) || ' of 100'
  FROM acked a, LATERAL idem_lookup(sha256(convert_to(a.label, 'UTF8')), sha256(convert_to(a.label, 'UTF8'))) l
 WHERE a.label::int <= 100 AND l.outcome = 'replay' AND l.response_body = convert_to('body ' || a.label, 'UTF8');
SELECT 'live leases still held: ' || count(*) || ' of 100'
  FROM acked a, LATERAL idem_claim(sha256(convert_to(a.label, 'UTF8')), sha256(convert_to(a.label, 'UTF8'))) l
 WHERE a.label::int > 100 AND l.outcome = 'in_progress';
SELECT 'a forged claim id refused: ' || NOT idem_finalize(sha256(convert_to('101', 'UTF8')), gen_random_uuid(), 201, NULL, 'x');
SELECT 'the owner finalizes on the new primary: ' || idem_finalize(sha256(convert_to(label, 'UTF8')), claim_id, 201, NULL, 'late')
  FROM acked WHERE label = '101';
SQL
