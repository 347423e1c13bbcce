# Suite of tests/run.sh: pg_idem sharded on PL/Proxy (tests/scaleout): a
# router and partition servers of their own, started by the TAP scripts.
# Sourced; uses count, say, as_run_user, install_missing_packages, $WORK, $PG_BIN.

# run_prove_suite NAME GLOB [ENV=VALUE...]: prove the TAP scripts GLOB (relative
# to the tree) and count their subtests; skipped ones count as neither.  Also
# used by the failover suite.
run_prove_suite() {
    local name=$1 tests_glob=$2 log="$WORK/$1.log" tests bad skipped
    shift 2
    say "$name"
    as_run_user env "$@" make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck \
        REGRESS= ISOLATION= PROVE_TESTS="$tests_glob" PROVE_FLAGS=-v >"$log" 2>&1
    local rc=$?
    grep -vE '^# ' "$log" | tail -n 80
    tests=$(grep -oE 'Tests=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    bad=$(grep -oE '^Failed [0-9]+/' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc 2>/dev/null)
    skipped=$(grep -cE '^ok [0-9]+ # skip' "$log")
    tests=$(( ${tests:-0} - skipped ))
    bad=${bad:-0}
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
        bad=1
        tail -n 100 "$WORK"/src/tmp_check/log/*.log 2>/dev/null | tail -n 200
    fi
    [ "$skipped" -gt 0 ] && echo "$name: $skipped skipped"
    count "$name" $((tests - bad > 0 ? tests - bad : 0)) "$bad"
}

# A test binary of the C++ client (client/cpp/tests): the partition routing
# tests, or $1; built if the client suite did not build it already; empty
# when the client does not build.
scaleout_client_binary() {
    local build target=${1:-idem_partition_tests} bin
    build=$(client_build)
    bin="$build/tests/$target"
    if [ ! -x "$bin" ] && [ -f "$WORK/src/client/cpp/CMakeLists.txt" ]; then
        as_run_user cmake -S "$(client_source)" -B "$build" \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_IDEM_BUILD_TESTS=ON >"$WORK/scaleout-build.log" 2>&1 &&
            as_run_user cmake --build "$build" -j2 --target "$target" \
                >>"$WORK/scaleout-build.log" 2>&1 ||
            tail -n 40 "$WORK/scaleout-build.log" >&2
    fi
    [ -x "$bin" ] && echo "$bin"
}

# The Node client's directory, with its node_modules (npm ci when the node
# suite did not run first); empty when npm ci fails.
scaleout_node_client() {
    local dir="$WORK/src/client/node"
    if [ ! -d "$dir/node_modules" ] && [ -f "$dir/package.json" ]; then
        command -v npm >/dev/null || install_missing_packages npm >&2
        (cd "$dir" && as_run_user npm ci --no-audit --no-fund --loglevel=error) >"$WORK/scaleout-npm.log" 2>&1 ||
            tail -n 20 "$WORK/scaleout-npm.log" >&2
    fi
    [ -d "$dir/node_modules" ] && echo "$dir"
}

suite_scaleout() {
    if ! postgres_has_extension plproxy; then
        skip_suite scaleout "PL/Proxy is not built for PostgreSQL $PG_MAJOR (Debian packages it for $DEBIAN_PG_MAJOR here)"
        return
    fi
    run_prove_suite scaleout 'tests/scaleout/t/*.pl' \
        IDEM_PARTITION_TESTS="$(scaleout_client_binary)" \
        IDEM_PYTHON="${PYTHON:-/usr/bin/python3}" IDEM_NODE_CLIENT="$(scaleout_node_client)"
}
