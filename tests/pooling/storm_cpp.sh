# Sourced by tests/suites/65_pooling.sh (every tests/pooling/storm_*.sh;
# each defines storm_NAME, called with PgBouncer running): the C++ runner's
# one-line setup with its defaults (simple_pool + runner, no pooler
# setting) through PgBouncer in transaction mode with a pool of 5 server
# connections: 20 duplicates of a 300 ms handler, in lease mode and with
# run_fenced. Each must run the handler exactly once, answer no 503, and
# finish within about twice the same storm straight to the server (2x
# plus 200 ms for a loaded machine's scheduling; a storm over it is run
# once more before it counts as failed).
# Uses count, say, as_run_user, $WORK, $PG_BIN, $PGPORT, $PGUSER, $PGBOUNCER_PORT.

storm_cpp() {
    local build bin log=$WORK/pooling-storm-cpp.log db=idem_pool_storm_cpp
    build=$(client_build)
    bin=$build/tests/idem_pooling_storm
    if [ ! -x "$bin" ]; then
        if ! as_run_user cmake -S "$(client_source)" -B "$build" -DPG_IDEM_BUILD_TESTS=ON \
                -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$log" 2>&1 ||
           ! as_run_user cmake --build "$build" -j2 --target idem_pooling_storm >>"$log" 2>&1; then
            tail -n 40 "$log"
            count "pooling: C++ storm build" 0 1
            return
        fi
    fi
    as_run_user "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -d postgres \
        -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >>"$log" 2>&1
    as_run_user "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -d "$db" \
        -c "CREATE EXTENSION pg_idem" >>"$log" 2>&1
    # A pool smaller than the duplicates (PgBouncer applies it to its pools at once).
    as_run_user "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PGBOUNCER_PORT" -d pgbouncer \
        -c "SET default_pool_size = 5" >>"$log" 2>&1
    local direct="host=$WORK port=$PGPORT user=$PGUSER dbname=$db"
    local pooled="host=127.0.0.1 port=$PGBOUNCER_PORT user=$PGUSER dbname=$db"
    local mode out direct_ms pooled_ms ok try
    for mode in lease fenced; do
        say "pooling: C++ runner defaults, 20 duplicates of a 300 ms handler ($mode), pool 5"
        out=$(as_run_user timeout 120 "$bin" "$direct" "$mode" 20 300 2>>"$log")
        echo "   direct:    $out"
        direct_ms=$(sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$out")
        ok=0
        for try in 1 2; do
            out=$(as_run_user timeout 120 "$bin" "$pooled" "$mode" 20 300 2>>"$log") || { ok=0; echo "   pgbouncer: $out"; break; }
            pooled_ms=$(sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$out")
            echo "   pgbouncer: $out (bound $((2 * ${direct_ms:-0} + 200)) ms)"
            if [ -n "$direct_ms" ] && [ "$pooled_ms" -le $((2 * direct_ms + 200)) ]; then
                ok=1
                break
            fi
        done
        if [ "$ok" = 1 ]; then
            count "pooling: C++ storm $mode" 1 0
        else
            tail -n 20 "$log"
            count "pooling: C++ storm $mode" 0 1
        fi
    done
    as_run_user "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PGBOUNCER_PORT" -d pgbouncer \
        -c "SET default_pool_size = ${PGBOUNCER_POOL_SIZE:-8}" >>"$log" 2>&1
    true
}
