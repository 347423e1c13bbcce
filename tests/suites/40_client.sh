# Suite of tests/run.sh: the C++ client (client/cpp): GoogleTest and ctest.  Sourced; uses count, say, as_run_user, $WORK, $PG_BIN.
# ctest prints "N% tests passed, M tests failed out of T".
suite_client() {
    [ -f "$WORK/src/client/cpp/CMakeLists.txt" ] || return 0
    local log="$WORK/client.log" total bad
    say "C++ client: building (cmake, about 3 minutes on 2 cores; log in $log)"
    if ! as_run_user cmake -S "$(client_source)" -B "$(client_build)" \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPG_IDEM_BUILD_TESTS=ON \
            -DPG_IDEM_BUILD_EXAMPLES=ON -DPG_IDEM_BUILD_BENCH=ON >"$log" 2>&1 ||
       ! as_run_user cmake --build "$(client_build)" -j2 >>"$log" 2>&1; then
        tail -n 80 "$log"
        count "C++ client build" 0 1
        return
    fi
    say "C++ client: running ctest (unit, integration, install consumer, demo storm, quickstart)"
    as_run_user env PG_IDEM_TEST_DSN="host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" \
        ctest --test-dir "$(client_build)" --output-on-failure -V >>"$log" 2>&1
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

