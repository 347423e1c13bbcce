#!/usr/bin/env bash
# make test: every suite against real servers, then one line "N passed, N failed".
#
# Installs what is missing, builds and installs the extension, starts a
# throwaway cluster (as an unprivileged user when run as root), and runs
# pg_regress, the isolation specs, the TAP tests, the C++ client tests and
# the driver examples.  A suite that fails does not stop the others.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"

PASSED=0
FAILED=0
FAILED_SUITES=()

count() {   # count SUITE PASSED FAILED
    PASSED=$((PASSED + $2))
    FAILED=$((FAILED + $3))
    [ "$3" -gt 0 ] && FAILED_SUITES+=("$1")
    printf '%s: %d passed, %d failed\n' "$1" "$2" "$3"
}

# pg_regress and pg_isolation_regress print "test name ... ok" per test.
run_pg_regress_suite() {   # NAME MAKE-ARGS...
    local name=$1 log="$WORK/$1.log" ok bad
    shift
    say "$name"
    as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck "$@" \
        >"$log" 2>&1
    local rc=$?
    cat "$log"
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$log")
    bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]|failed \(ignored\)' "$log")
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    if [ "$bad" -gt 0 ]; then
        for diffs in "$WORK/src/regression.diffs" "$WORK/src/output_iso/regression.diffs"; do
            [ -f "$diffs" ] && head -c 20000 "$diffs"
        done
    fi
    count "$name" "$ok" "$bad"
}

# prove prints "Files=N, Tests=M" and "Failed X/Y subtests" on failure.
run_tap_suite() {
    local log="$WORK/tap.log" tests bad
    say "TAP"
    as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck \
        REGRESS= ISOLATION= PROVE_FLAGS=-v >"$log" 2>&1
    local rc=$?
    grep -vE '^# ' "$log" | tail -n 60
    tests=$(grep -oE 'Tests=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    bad=$(grep -oE '^Failed [0-9]+/' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc 2>/dev/null)
    tests=${tests:-0}
    bad=${bad:-0}
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
        bad=1
        tail -n 100 "$WORK"/src/tmp_check/log/*.log 2>/dev/null | tail -n 200
    fi
    count TAP $((tests - bad > 0 ? tests - bad : 0)) "$bad"
}

# ctest prints "N% tests passed, M tests failed out of T".
run_client_suite() {
    [ -f "$WORK/src/client/cpp/CMakeLists.txt" ] || return 0
    local log="$WORK/client.log" total bad
    say "C++ client"
    if ! as_run_user cmake -S "$WORK/src/client/cpp" -B "$WORK/client-build" \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$log" 2>&1 ||
       ! as_run_user cmake --build "$WORK/client-build" -j2 >>"$log" 2>&1; then
        tail -n 80 "$log"
        count "C++ client build" 0 1
        return
    fi
    as_run_user env PG_IDEM_TEST_DSN="host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" \
        ctest --test-dir "$WORK/client-build" --output-on-failure -V >>"$log" 2>&1
    local rc=$?
    grep -E 'Test +#|tests passed|\[  (PASSED|FAILED) +\]|\*\*\*' "$log" | tail -n 80
    # GoogleTest binaries count their test cases; other ctest tests count once.
    local gtest_ok gtest_bad ctest_total ctest_bad gtest_binaries
    gtest_ok=$(grep -oE '\[  PASSED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc)
    gtest_bad=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc)
    gtest_binaries=$(grep -cE '^\S*[0-9]+: \[==========\] [0-9]+ tests? from .* ran' "$log")
    ctest_total=$(grep -oE 'out of [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
    ctest_bad=$(grep -oE '[0-9]+ tests failed' "$log" | tail -1 | grep -oE '[0-9]+')
    gtest_ok=${gtest_ok:-0} gtest_bad=${gtest_bad:-0}
    ctest_total=${ctest_total:-0} ctest_bad=${ctest_bad:-0}
    local other_ok=$((ctest_total - gtest_binaries - ctest_bad))
    [ "$other_ok" -lt 0 ] && other_ok=0
    bad=$((gtest_bad > ctest_bad ? gtest_bad : ctest_bad))
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "C++ client" $((gtest_ok + other_ok)) "$bad"
}

# Examples in other languages: each script exits non-zero on failure.
run_examples() {
    local script
    for script in "$WORK"/src/client/examples/*/run-example.sh; do
        [ -f "$script" ] || continue
        say "example $(basename "$(dirname "$script")")"
        if as_run_user bash "$script"; then
            count "example $(basename "$(dirname "$script")")" 1 0
        else
            count "example $(basename "$(dirname "$script")")" 0 1
        fi
    done
}

install_missing_packages bc
make_workdir test
build_and_install_extension "$ROOT"
copy_tree "$ROOT"
start_cluster "shared_preload_libraries = 'pg_idem'" || { echo "0 passed, 1 failed"; exit 1; }

# SUITES selects a subset while developing, e.g. make test SUITES="regress tap".
SUITES=" ${SUITES:-regress isolation tap client examples} "
[[ $SUITES == *" regress "* ]] && run_pg_regress_suite "pg_regress" ISOLATION= TAP_TESTS=
[[ $SUITES == *" isolation "* ]] && run_pg_regress_suite "isolation" REGRESS= TAP_TESTS=
[[ $SUITES == *" tap "* ]] && run_tap_suite
[[ $SUITES == *" client "* ]] && run_client_suite
[[ $SUITES == *" examples "* ]] && run_examples

stop_cluster
echo
[ ${#FAILED_SUITES[@]} -gt 0 ] && echo "failed suites: ${FAILED_SUITES[*]}"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
