#!/usr/bin/env bash
# The duplicate-request storm: idem-demo-server on a fresh database, and
# idem-demo-storm's table of what should happen and what did. `make demo`
# runs it (tests/demo.sh) on a throwaway cluster; ctest runs it as the test
# demo_storm.
#
#   storm.sh [--quick] [--server BIN --sender BIN] [--dsn CONNINFO]
#   storm.sh --ctest --server BIN --sender BIN     # quick; PG_IDEM_TEST_DSN or skip (77)
#   storm.sh --server-cmd "python3 client/python/examples/demo_server.py" --sender BIN
#   storm.sh --server-cmd "node client/node/examples/demo-server.js" --sender BIN
#
# --server-cmd runs another implementation of the service (the Python and
# Node clients' example services have the same interface); the script
# appends the same flags it gives idem-demo-server (--port 0 --bind --dsn
# --wait-budget-ms --cooldown-ms --port-file --pid-file). The command is
# split on spaces; relative paths are taken from the repository root.
# Without --server/--sender it builds the client library and the demo with
# cmake (into $IDEM_DEMO_BUILD, or a scratch directory). The PostgreSQL
# server comes from --dsn or the libpq environment (PGHOST, PGPORT, PGUSER)
# and needs pg_idem installed: the script creates the database idem_demo
# there (dropping an old one) with the extension, starts the service on a
# free port (as the postgres user when run as root), runs the storm, and
# stops the service and drops the database however it ends. Exits non-zero
# if any expectation fails.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
PSQL=psql
[ -x "/usr/lib/postgresql/${PG_MAJOR:-15}/bin/psql" ] && PSQL=/usr/lib/postgresql/${PG_MAJOR:-15}/bin/psql

say() { printf '\n== %s\n' "$*"; }

# The service needs no privilege: as root, run it as the postgres user
# (with this environment, from a directory that user may enter).
run_unprivileged() {
    if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
        (cd "$SCRATCH" && exec runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

QUICK=0 CTEST=0 SERVER= SENDER= DSN= SERVER_CMD=
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1 ;;
        --ctest) CTEST=1 QUICK=1 ;;
        --server) SERVER=$2; shift ;;
        --server-cmd) SERVER_CMD=$2; shift ;;
        --sender) SENDER=$2; shift ;;
        --dsn) DSN=$2; shift ;;
        *) echo "usage: storm.sh [--quick] [--ctest] [--server BIN | --server-cmd CMD] [--sender BIN] [--dsn CONNINFO]" >&2
           exit 2 ;;
    esac
    shift
done
if [ "$CTEST" = 1 ]; then
    if [ -z "${PG_IDEM_TEST_DSN:-}" ]; then
        echo "storm.sh: PG_IDEM_TEST_DSN is not set, skipped"
        exit 77
    fi
    DSN=$PG_IDEM_TEST_DSN
fi
[ -n "$SERVER" ] && SERVER=$(realpath "$SERVER")
[ -n "$SENDER" ] && SENDER=$(realpath "$SENDER")

# Scratch space the service's user can write to.
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/pg_idem.storm.XXXXXX")
chmod 755 "$SCRATCH"
[ "$(id -u)" = 0 ] && chown postgres: "$SCRATCH"

SERVER_PID= DB_CREATED=
cleanup() {
    local rc=$?
    if [ -f "$SCRATCH/server.pid" ]; then
        kill "$(cat "$SCRATCH/server.pid")" 2>/dev/null || true
    fi
    if [ -n "$SERVER_PID" ]; then
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    if [ -n "$DB_CREATED" ]; then
        "$PSQL" -X -q -d "$ADMIN_DSN" -c "DROP DATABASE IF EXISTS idem_demo WITH (FORCE)" \
            >/dev/null 2>&1 || true
    fi
    if [ "$rc" -ne 0 ] && [ -s "$SCRATCH/server.log" ]; then
        echo "--- last lines of the service's log"
        tail -n 30 "$SCRATCH/server.log"
    fi
    rm -rf "$SCRATCH"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Another service implementation: its words, relative paths from the root.
SERVER_ARGV=()
if [ -n "$SERVER_CMD" ]; then
    read -r -a words <<<"$SERVER_CMD"
    for w in "${words[@]}"; do
        if [[ $w != /* ]] && [ -e "$ROOT/$w" ]; then w=$ROOT/$w; fi
        SERVER_ARGV+=("$w")
    done
    SERVER=${SERVER:-${SERVER_ARGV[0]}}
fi

if [ -z "$SERVER" ] || [ -z "$SENDER" ]; then
    BUILD=${IDEM_DEMO_BUILD:-$SCRATCH/build}
    say "building the client library and the demo (cmake, about 2 minutes on 2 cores; $BUILD)"
    if ! { cmake -S "$ROOT/client/cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
               -DPG_IDEM_BUILD_TESTS=OFF -DPG_IDEM_BUILD_BENCH=OFF -DPG_IDEM_BUILD_EXAMPLES=ON &&
           cmake --build "$BUILD" -j2 --target idem-demo-server idem-demo-storm; } \
            >"$SCRATCH/build.log" 2>&1; then
        tail -n 60 "$SCRATCH/build.log"
        echo "storm.sh: the build failed (is libcpp-httplib-dev installed?)"
        exit 1
    fi
    [ -z "$SERVER" ] && SERVER=$BUILD/examples/demo/idem-demo-server
    SENDER=$BUILD/examples/demo/idem-demo-storm
fi
[ ${#SERVER_ARGV[@]} -eq 0 ] && SERVER_ARGV=("$SERVER")

# A fresh database with the extension; later keywords of a conninfo win.
ADMIN_DSN=${DSN:-dbname=${PGDATABASE:-postgres}}
DEMO_DSN="$ADMIN_DSN dbname=idem_demo"
say "creating the database idem_demo"
"$PSQL" -X -q -v ON_ERROR_STOP=1 -d "$ADMIN_DSN" -c "SET client_min_messages = warning" \
    -c "DROP DATABASE IF EXISTS idem_demo WITH (FORCE)" -c "CREATE DATABASE idem_demo" >/dev/null
DB_CREATED=1
"$PSQL" -X -q -v ON_ERROR_STOP=1 -d "$DEMO_DSN" -c "CREATE EXTENSION pg_idem" >/dev/null

# 1 s follower wait budget and 1 s failure cooldown keep the storm short.
run_unprivileged "${SERVER_ARGV[@]}" --port 0 --bind 127.0.0.1 --dsn "$DEMO_DSN" \
    --wait-budget-ms 1000 --cooldown-ms 1000 \
    --port-file "$SCRATCH/port" --pid-file "$SCRATCH/server.pid" \
    >"$SCRATCH/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
    [ -s "$SCRATCH/port" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "storm.sh: the service did not start"; exit 1; }
    sleep 0.1
done
[ -s "$SCRATCH/port" ] || { echo "storm.sh: the service did not start in 10 s"; exit 1; }
PORT=$(cat "$SCRATCH/port")
say "$(basename "${SERVER_ARGV[-1]}") on http://127.0.0.1:$PORT (wait budget 1 s, cooldown 1 s); the storm:"

CONCURRENCY=50
[ "$QUICK" = 1 ] && CONCURRENCY=20
"$SENDER" --port "$PORT" --concurrency "$CONCURRENCY"
