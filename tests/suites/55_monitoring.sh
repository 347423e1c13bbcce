# Suite of tests/run.sh: docs/monitoring/prometheus with Debian's
# prometheus-postgres-exporter.  Sourced; uses count, say, as_run_user, free_port, $WORK.
# A database with a stuck, an in-flight and a cooling key, outbox and
# inbox backlog and dead letters, pg_idem in the README's schema idem; the
# exporter runs as idem_monitor (made by monitor-role.sql, nothing else:
# the role's search_path comes from the script) with pg_idem_queries.yaml,
# every pg_idem_* series of the file must be served, and each count must
# equal what the views say.
suite_monitoring() {
    local exporter=/usr/bin/prometheus-postgres-exporter dir="$WORK/src/docs/monitoring/prometheus"
    local db=idem_monitoring ok=0 bad=0 port metrics="$WORK/metrics.txt"
    say "monitoring: prometheus-postgres-exporter with pg_idem_queries.yaml"
    if [ ! -x "$exporter" ]; then
        echo "prometheus-postgres-exporter is not installed"
        count monitoring 0 1
        return
    fi
    local sql=(as_run_user psql -X -q -At -v ON_ERROR_STOP=1)
    PGOPTIONS=--client-min-messages=warning "${sql[@]}" -d postgres \
        -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    "${sql[@]}" -d $db -c "CREATE SCHEMA idem" -c "CREATE EXTENSION pg_idem SCHEMA idem" >/dev/null
    "${sql[@]}" -d $db -v schema=idem -f "$dir/monitor-role.sql" >/dev/null || { count monitoring 0 1; return; }
    # State every metric can see: keys, outbox events, inbox messages.
    "${sql[@]}" -d $db >/dev/null <<'SQL'
SET search_path = idem;
SELECT idem_claim(idem_key('mon', 'POST', '/p', 'inflight'), sha256('b'), '1 hour');
SELECT idem_claim(idem_key('mon', 'POST', '/p', 'stuck'), sha256('b'), '1 ms');
SELECT idem_fail(idem_key('mon', 'POST', '/p', 'cooling'), claim_id, '1 hour')
  FROM idem_claim(idem_key('mon', 'POST', '/p', 'cooling'), sha256('b'));
SELECT idem_outbox_stage('orders', '{"n": 1}'::jsonb);
SELECT idem_outbox_stage('orders', '{"n": 2}'::jsonb);
SET idem.outbox_max_attempts = 1;
SELECT idem_outbox_nack(c.claim_token, c.id, 'broker down')
  FROM idem_outbox_claim(1) c;
BEGIN;
SELECT idem_inbox_begin('billing', 'm1', sha256('p'), 1);
SELECT idem_inbox_fail('billing', 'm1', 'handler failed');
COMMIT;
BEGIN;
SELECT idem_inbox_begin('billing', 'm2', sha256('p'), 3);
SELECT idem_inbox_fail('billing', 'm2', 'handler failed, retried');
COMMIT;
SELECT pg_sleep(0.05);
SQL
    port=$(free_port)
    # Debian 12's exporter (0.11) has its bgwriter collector read columns
    # PostgreSQL 17 moved to pg_stat_checkpointer, and reports the error;
    # pg_idem's metrics need no built-in collector.
    local collectors=()
    [ "$(as_run_user psql -X -At -d "$db" -c 'SHOW server_version_num')" -ge 170000 ] &&
        collectors=(--no-collector.bgwriter)
    as_run_user env DATA_SOURCE_NAME="postgresql://idem_monitor@127.0.0.1:$PGPORT/$db?sslmode=disable" \
        bash -c 'echo $$ >"$0"; exec "$@"' "$WORK/exporter.pid" "$exporter" \
        --web.listen-address="127.0.0.1:$port" --extend.query-path="$dir/pg_idem_queries.yaml" \
        --disable-default-metrics --disable-settings-metrics "${collectors[@]}" \
        >"$WORK/exporter.log" 2>&1 &
    # Until the metrics are there, under a generous deadline (a busy
    # machine starts the exporter slowly).
    local got= deadline=$((SECONDS + 180))
    while [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.2
        if /usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
                "http://127.0.0.1:$port/metrics" >"$metrics" 2>/dev/null && grep -q '^pg_idem_keys_stuck' "$metrics"; then
            got=1
            break
        fi
    done
    [ -f "$WORK/exporter.pid" ] && kill "$(cat "$WORK/exporter.pid")" 2>/dev/null
    wait 2>/dev/null
    if [ -z "$got" ]; then
        echo "no pg_idem metric on /metrics; the exporter said:"
        tail -n 20 "$WORK/exporter.log"
        count monitoring 0 1
        return
    fi

    # expect METRIC LABEL SQL: the value of the metric's series with label
    # LABEL (and datname) equals SQL's answer, which is not 0.
    expect() {
        local metric=$1 label=$2 want have
        want=$("${sql[@]}" -d $db -c "SET search_path = idem; $3")
        have=$(grep -E "^$metric\{" "$metrics" | grep -F "datname=\"$db\"" | grep -F "$label" |
               awk '{print $2}' | head -1)
        if [ -n "$have" ] && [ "$want" != 0 ] && awk -v a="$have" -v b="$want" 'BEGIN { exit !(a == b) }'; then
            echo "ok   $metric${label:+ $label} = $have"
            ok=$((ok + 1))
        else
            echo "FAIL $metric${label:+ $label} = '${have}', the database says '$want'"
            bad=$((bad + 1))
        fi
    }
    # present METRIC: the series is served for the database (a time or a 0, not compared).
    present() {
        if grep -E "^$1\{" "$metrics" | grep -qF "datname=\"$db\""; then
            echo "ok   $1 is served"
            ok=$((ok + 1))
        else
            echo "FAIL $1 is not served"
            bad=$((bad + 1))
        fi
    }
    expect pg_idem_keys_inflight "" "SELECT count(*) FROM idem_inflight"
    expect pg_idem_keys_stuck "" "SELECT count(*) FROM idem_stuck"
    expect pg_idem_keys_cooling "" "SELECT count(*) FROM idem_cooling"
    stuck_scope=$("${sql[@]}" -d $db -c "SET search_path = idem; SELECT scope::text FROM idem_stuck LIMIT 1")
    expect pg_idem_stuck_by_scope_keys "scope=\"$stuck_scope\"" \
        "SELECT count(*) FROM idem_stuck WHERE scope::text = '$stuck_scope'"
    expect pg_idem_outbox_backlog "" "SELECT count(*) FROM idem_outbox WHERE state = 'pending'"
    expect pg_idem_outbox_dead "" "SELECT count(*) FROM idem_outbox_dead"
    expect pg_idem_inbox_dead "" "SELECT count(*) FROM idem_inbox_dead"
    expect pg_idem_outbox_due "" "SELECT count(*) FROM idem_outbox WHERE state = 'pending' AND available_at <= clock_timestamp()"
    expect pg_idem_inbox_retrying "" "SELECT count(*) FROM idem_inbox WHERE state = 'failed'"
    # (processing: only inside an attempt's transaction, 0 between them.)
    present pg_idem_inbox_processing
    present pg_idem_keys_oldest_stuck_seconds
    present pg_idem_outbox_oldest_backlog_seconds
    # Every series the query file defines is served.
    local series missing=
    for series in $(/usr/bin/python3 - "$dir/pg_idem_queries.yaml" <<'PY'
import re, sys
# Every column of a query that is not a LABEL is a series query_column.
query = column = None
series = []
for line in open(sys.argv[1]):
    m = re.match(r'^(pg_idem_\w+):', line)
    if m:
        query = m.group(1)
    m = re.match(r'^\s+- (\w+):', line)
    if m and query:
        column = m.group(1)
        series.append(f"{query}_{column}")
    m = re.match(r'^\s+usage:\s*"(\w+)"', line)
    if m and column and m.group(1) == "LABEL":
        series.remove(f"{query}_{column}")
print("\n".join(series))
PY
    ); do
        grep -qE "^$series\{" "$metrics" || missing+=" $series"
    done
    if [ -z "$missing" ]; then
        echo "ok   every pg_idem_* series of the query file is served"
        ok=$((ok + 1))
    else
        echo "FAIL not served:$missing"
        bad=$((bad + 1))
    fi
    expect pg_idem_stats_value 'counter="outbox_dead"' "SELECT value FROM idem_stats WHERE counter = 'outbox_dead'"
    expect pg_idem_stats_value 'counter="inbox_dead_lettered"' "SELECT value FROM idem_stats WHERE counter = 'inbox_dead_lettered'"
    # The exporter read the file and every query ran.
    if grep -qE '^pg_exporter_user_queries_load_error\{.*\} 0$' "$metrics" &&
       ! grep -qiE 'error running query|level=error' "$WORK/exporter.log"; then
        echo "ok   the query file loaded and every query ran"
        ok=$((ok + 1))
    else
        echo "FAIL the exporter reported an error:"
        grep -E 'load_error' "$metrics"
        grep -iE 'error' "$WORK/exporter.log" | tail -n 10
        bad=$((bad + 1))
    fi
    PGOPTIONS=--client-min-messages=warning "${sql[@]}" -d postgres \
        -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP ROLE IF EXISTS idem_monitor" >/dev/null
    count monitoring "$ok" "$bad"
}
