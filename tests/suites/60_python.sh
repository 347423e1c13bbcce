# Suite of tests/run.sh: the Python client (client/python): pytest, the
# offline install, and the storm against its example service.  Sourced;
# uses count, say, as_run_user, run_demo_storm, $WORK, $PGPORT, $PGUSER.
# pytest prints "N passed, M failed, K skipped in T s".
PYTHON=${PYTHON:-/usr/bin/python3}

suite_python() {
    local dir="$WORK/src/client/python" log="$WORK/python.log" summary ok bad
    [ -f "$dir/pyproject.toml" ] || return 0
    say "Python client (pytest)"
    (cd "$dir" && as_run_user env PG_IDEM_TEST_DSN="host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" \
        "$PYTHON" -m pytest -p no:cacheprovider -q -rfEs tests) >"$log" 2>&1
    local rc=$?
    tail -n 60 "$log"
    summary=$(grep -E '^=*.*[0-9]+ (passed|failed|error)' "$log" | tail -1)
    ok=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')
    bad=$(echo "$summary" | grep -oE '[0-9]+ (failed|errors?)' | grep -oE '[0-9]+' | paste -sd+ | bc)
    ok=${ok:-0} bad=${bad:-0}
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    # The integration tests skip without a database: here that is a failure.
    grep -qE '[0-9]+ skipped' <<<"$summary" && bad=$((bad + 1)) && echo "python: tests were skipped"
    count "Python client" "$ok" "$bad"

    say "Python client: pip install --no-build-isolation --no-index into a venv"
    if as_run_user "$PYTHON" -m venv --system-site-packages "$WORK/pyvenv" >"$WORK/pip.log" 2>&1 &&
       (cd "$WORK" && as_run_user "$WORK/pyvenv/bin/pip" install -q --no-build-isolation --no-index \
            "$dir") >>"$WORK/pip.log" 2>&1 &&
       (cd / && as_run_user "$WORK/pyvenv/bin/python" -c \
            'import pg_idem, pg_idem.aio, pg_idem.asgi, pg_idem.wsgi, sys; assert "pyvenv" in pg_idem.__file__, pg_idem.__file__') \
            >>"$WORK/pip.log" 2>&1; then
        count "Python install" 1 0
    else
        tail -n 30 "$WORK/pip.log"
        count "Python install" 0 1
    fi

    run_demo_storm Python "$PYTHON $WORK/src/client/python/examples/demo_server.py"
}
