# Suite of tests/run.sh: everything that should work behind a
# transaction-mode pooler, through PgBouncer (pool_mode = transaction, a
# pool smaller than the number of clients) in front of the test cluster.
# Sourced; uses count, say, as_run_user, $WORK, $PG_BIN, $PGPORT.
#
#   * the C++ client's integration tests (lease, fenced, in-transaction,
#     processes, followers and their wait budget; inbox, outbox drainer,
#     reconciler) with unnamed statements (PG_IDEM_TEST_POOLER);
#   * the psql and Python examples;
#   * the Python storm (tests/pooling/python_storm.py): the one-line
#     FastAPI setup with its defaults behind its own PgBouncer, pool 5.
#   * the Node storm (tests/pooling/node_storm.sh, its own PgBouncer, pool 5).
#   * each one-line setup's storm of duplicates (tests/pooling/storm_*.sh).
#
# Left out, because the test itself needs a session of its own (not the
# client): tests that freeze a COMMIT with a session-level advisory lock
# held on a gate connection or find a backend by its session
# (UnknownOutcome.*, FollowerIsNotWokenBeforeTheFinalizeCommits,
# RenewalSurvivesALostConnection, Inbox.LostCommitIsUnknown...); tests
# that pass settings as startup options, which PgBouncer drops
# (ignore_startup_parameters; OverTheServerCap..., ExpiredKeyIsGone, the
# outbox backoff tests); and the named-statement tests, which show what a
# pooler without max_prepared_statements cannot do.
POOLING_CLIENT_EXCLUDE="Statements.Named*:UnknownOutcome.*:Runner.FollowerIsNotWokenBeforeTheFinalizeCommits:Runner.RenewalSurvivesALostConnection:Runner.OverTheServerCapIsStoredNotReplayable:ServerWait.ExpiredKeyIsGone:ServerWait.StatementTimeoutFallsBackToPolling"
POOLING_MESSAGES_EXCLUDE="Inbox.LostCommitIsUnknownAndTheHandlerIsNotRerun:Outbox.FailingPublisherIsRetriedAfterBackoffThenDead:Outbox.FailedEventHoldsItsKeyUntilItIsPublished"

# Counts a GoogleTest binary's "[  PASSED  ] N" / "[  FAILED  ] N" lines.
pooling_count_gtest() {   # NAME LOG RC
    local ok bad
    ok=$(grep -oE '\[  PASSED  \] [0-9]+ test' "$2" | grep -oE '[0-9]+' | tail -1)
    bad=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$2" | grep -oE '[0-9]+' | tail -1)
    ok=${ok:-0} bad=${bad:-0}
    [ "$3" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && grep -E '^\[  FAILED  \]|Failure|Which is|Expected' "$2" | head -n 40
    count "$1" "$ok" "$bad"
}

suite_pooling() {
    [ -f "$WORK/src/tests/pooling/pgbouncer.sh" ] || return 0
    . "$WORK/src/tests/pooling/pgbouncer.sh"
    if [ ! -x "$PGBOUNCER" ]; then
        say "pooling: $PGBOUNCER is missing (Debian package pgbouncer)"
        count "pooling: pgbouncer" 0 1
        return
    fi
    say "pooling: PgBouncer in transaction mode"
    if ! start_pgbouncer; then
        count "pooling: pgbouncer start" 0 1
        return
    fi
    local log=$WORK/pooling.log build rc
    build=$(client_build)
    local dsn="host=127.0.0.1 port=$PGBOUNCER_PORT user=$PGUSER dbname=postgres"

    # The C++ client, built by the client suite (or here when run alone).
    if [ -f "$WORK/src/client/cpp/CMakeLists.txt" ]; then
        if [ ! -x "$build/tests/idem_integration_tests" ] || [ ! -x "$build/tests/idem_message_tests" ]; then
            if ! as_run_user cmake -S "$(client_source)" -B "$build" \
                    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$log" 2>&1 ||
               ! as_run_user cmake --build "$build" -j2 >>"$log" 2>&1; then
                tail -n 40 "$log"
                count "pooling: C++ client build" 0 1
            fi
        fi
        if [ -x "$build/tests/idem_integration_tests" ]; then
            say "pooling: C++ client runner through PgBouncer"
            as_run_user env PG_IDEM_TEST_DSN="$dsn" PG_IDEM_TEST_POOLER=1 PG_IDEM_TEST_FOLLOWERS=40 \
                timeout 600 "$build/tests/idem_integration_tests" \
                --gtest_filter="-$POOLING_CLIENT_EXCLUDE" >"$log.runner" 2>&1
            rc=$?
            pooling_count_gtest "pooling: C++ runner" "$log.runner" "$rc"
        fi
        if [ -x "$build/tests/idem_message_tests" ]; then
            say "pooling: C++ inbox, outbox drainer, reconciler through PgBouncer"
            as_run_user env PG_IDEM_TEST_DSN="$dsn" PG_IDEM_TEST_POOLER=1 \
                timeout 300 "$build/tests/idem_message_tests" \
                --gtest_filter="-$POOLING_MESSAGES_EXCLUDE" >"$log.messages" 2>&1
            rc=$?
            pooling_count_gtest "pooling: C++ messages" "$log.messages" "$rc"
        fi
    fi

    # The driver examples, libpq's PGHOST/PGPORT at PgBouncer.
    local script name
    for script in "$WORK"/src/client/examples/*/run-example.sh; do
        [ -f "$script" ] || continue
        name=$(basename "$(dirname "$script")")
        say "pooling: example $name through PgBouncer"
        if as_run_user_via_pgbouncer timeout 300 bash "$script"; then
            count "pooling: example $name" 1 0
        else
            count "pooling: example $name" 0 1
        fi
    done

    # The Python client's one-line FastAPI setup, with its defaults, behind
    # a PgBouncer of its own with a pool of 5: 20 duplicates of a 300 ms handler.
    if [ -f "$WORK/src/tests/pooling/python_storm.py" ]; then
        say "pooling: Python one-line FastAPI setup, 20 duplicates behind PgBouncer (pool 5)"
        if as_run_user timeout 300 "${PYTHON:-/usr/bin/python3}" "$WORK/src/tests/pooling/python_storm.py" \
                --dsn "host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" --pgbouncer "$PGBOUNCER" \
                >"$log.pystorm" 2>&1; then
            cat "$log.pystorm"
            count "pooling: Python storm" 1 0
        else
            cat "$log.pystorm"
            count "pooling: Python storm" 0 1
        fi
    fi
    # The one-line setups' duplicate storms: tests/pooling/storm_NAME.sh defines storm_NAME.
    for script in "$WORK"/src/tests/pooling/storm_*.sh; do
        [ -f "$script" ] || continue
        . "$script"
        name=$(basename "$script" .sh)
        "$name"
    done
    stop_pgbouncer

    . "$WORK/src/tests/pooling/node_storm.sh"
    pooling_node_storm
}
