#!/usr/bin/env bash
# Run inside the fresh Debian 12 (tests/fresh_debian/run.sh), as the
# unprivileged user, from the repository's copy, after the docs' install
# blocks: proves that what they installed works.  One line per check,
# "ok NAME" or "not ok NAME", with what went wrong before it.
#
#   - the extension: a server of the system's PostgreSQL 15 (the files
#     `sudo make install` put there), started by this user with
#     shared_preload_libraries = 'pg_idem'; the README's Getting started
#     (schema, extension, a role with idem_client) and a claim and its
#     replay as that role;
#   - the Python client: the venv the install block made imports pg_idem
#     and runs a request through Runner, then its retry (a replay);
#   - the Node client: require('pg-idem') where npm installed it, one
#     request through Runner;
#   - the C++ client: a program built with CMake's find_package(pg_idem)
#     against the installed library, one request through idem::runner.
set -uo pipefail
cd "$HOME/pg_idem" || exit 1
BIN=/usr/lib/postgresql/15/bin
SOCK=$HOME/pgrun
DSN="host=$SOCK dbname=app user=my_service_role"
KEY=6f1c1a4e-2b57-4f0e-9a43-0c4b9d1f7e21

check() {   # check NAME COMMAND...: runs it, prints ok / not ok with its output
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        echo "ok $name"
    else
        printf '%s\n' "$out" | tail -n 30
        echo "not ok $name"
    fi
}

server() {
    rm -rf "$HOME/pgdata" "$SOCK" && mkdir -p "$SOCK" &&
    "$BIN/initdb" -D "$HOME/pgdata" -A trust -E UTF8 --locale=C.UTF-8 >"$HOME/initdb.log" &&
    printf "listen_addresses = ''\nunix_socket_directories = '%s'\nshared_preload_libraries = 'pg_idem'\nfsync = off\n" \
        "$SOCK" >>"$HOME/pgdata/postgresql.conf" &&
    "$BIN/pg_ctl" -D "$HOME/pgdata" -l "$HOME/server.log" -w start >/dev/null || { tail -n 20 "$HOME/server.log"; return 1; }
    [ "$(id -u)" != 0 ] || { echo "the server runs as root"; return 1; }
}

extension() {
    local out
    psql -X -q -h "$SOCK" -d postgres -v ON_ERROR_STOP=1 -c 'CREATE DATABASE app' &&
    psql -X -q -h "$SOCK" -d app -v ON_ERROR_STOP=1 -c "
        CREATE SCHEMA idem;
        CREATE EXTENSION pg_idem SCHEMA idem;
        CREATE ROLE my_service_role LOGIN;
        GRANT idem_client TO my_service_role;
        ALTER ROLE my_service_role SET search_path = idem, public;" || return 1
    out=$(psql -X -At -h "$SOCK" -d app -U my_service_role -v ON_ERROR_STOP=1 -c "
        SELECT c.outcome, idem_finalize(idem_key('u', 'POST', '/p', 'k'), c.claim_id, 201, '{}', 'paid')
          FROM idem_claim(idem_key('u', 'POST', '/p', 'k'), idem_request_hash('b')) AS c;
        SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
          FROM idem_claim(idem_key('u', 'POST', '/p', 'k'), idem_request_hash('b'));") || return 1
    [ "$out" = "$(printf 'claimed|t\nreplay paid')" ] || { echo "got: $out"; return 1; }
}

python_client() {
    (cd / && "$HOME/pg_idem/.venv/bin/python" - "$DSN" "$KEY" <<'PY'
import sys
import pg_idem
from pg_idem import Request, Response, Runner
assert "/.venv/" in pg_idem.__file__, pg_idem.__file__
runner = Runner(sys.argv[1])
req = Request(principal="py", method="POST", target="/payments", keys=[sys.argv[2]], body=b"{}")
first = runner.run(req, lambda claim: Response(201, [], b"python"))
retry = runner.run(req, lambda claim: Response(500, [], b"ran twice"))
assert (first.response.status, retry.response.status, retry.response.body) == (201, 201, b"python"), (first, retry)
assert retry.replayed, retry
PY
    )
}

node_client() {
    node - "$SOCK" "$KEY" <<'JS'
const pg = require('pg');
const { Runner } = require('pg-idem');
const [sock, key] = process.argv.slice(2);
(async () => {
  const pool = new pg.Pool({ host: sock, database: 'app', user: 'my_service_role' });
  const runner = new Runner(pool);
  const req = { principal: 'node', method: 'POST', target: '/payments', keys: [key], body: Buffer.from('{}') };
  const r = await runner.run(req, async () => ({ status: 201, body: 'node' }));
  if (r.response.status !== 201 || r.response.body.toString() !== 'node') throw new Error(JSON.stringify(r.response));
  await pool.end();
})().catch((e) => { console.error(e); process.exit(1); });
JS
}

cpp_client() {
    local d=$HOME/cpp-app
    rm -rf "$d" && mkdir -p "$d" || return 1
    cat >"$d/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(app CXX)
find_package(pg_idem 0.6 REQUIRED)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE pg_idem::idem)
CMAKE
    cat >"$d/app.cpp" <<'CPP'
#include <idem/runner.hpp>
#include <cstdio>
int main(int, char **argv)
{
    idem::simple_pool pool(argv[1]);
    idem::runner run(pool, idem::config::builder().build());
    idem::request_view req;
    req.principal = "cpp";
    req.method = "POST";
    req.target = "/payments";
    req.idempotency_keys = {argv[2]};
    req.body = "{}";
    idem::run_result r = run.run(req, [](const idem::claim_context &) {
        return idem::response{201, {}, "cpp"};
    });
    std::printf("%d %s\n", r.response.status, r.response.body.c_str());
    return r.response.status == 201 && r.response.body == "cpp" ? 0 : 1;
}
CPP
    cmake -S "$d" -B "$d/build" >"$d/cmake.log" 2>&1 && cmake --build "$d/build" >>"$d/cmake.log" 2>&1 ||
        { tail -n 30 "$d/cmake.log"; return 1; }
    "$d/build/app" "$DSN" "$KEY"
}

export PATH=$BIN:$PATH
check "the server starts as $(id -un) with shared_preload_libraries = 'pg_idem'" server || exit 0
check "CREATE EXTENSION pg_idem, a claim and its replay" extension
check "Python: the venv imports pg_idem, a request and its replay" python_client
check "Node: require('pg-idem'), a request" node_client
check "C++: find_package(pg_idem), a program built and a request" cpp_client
"$BIN/pg_ctl" -D "$HOME/pgdata" -m fast -w stop >/dev/null 2>&1
true
