# Suite of tests/run.sh: the Node client (client/node): npm ci into the
# scratch copy, node's test runner, and the storm against its example
# service.  Sourced; uses count, say, as_run_user, run_demo_storm,
# install_missing_packages, $WORK, $PGPORT, $PGUSER.
# node --test prints "# pass N", "# fail N", "# skipped N".
suite_node() {
    local dir="$WORK/src/client/node" log="$WORK/node.log" ok bad skipped
    [ -f "$dir/package.json" ] || return 0
    # NodeSource's nodejs brings npm; Debian's nodejs needs its npm package.
    command -v npm >/dev/null || install_missing_packages npm
    say "Node client: npm ci (registry: $(npm config get registry 2>/dev/null))"
    rm -rf "$dir/node_modules"
    if ! (cd "$dir" && as_run_user npm ci --no-audit --no-fund --loglevel=error) >"$WORK/npm.log" 2>&1; then
        tail -n 40 "$WORK/npm.log"
        count "Node client (npm ci)" 0 1
        return
    fi
    say "Node client (node --test)"
    # One file at a time: the files share the cluster's counters (idem_stats'
    # follower_waits), so on more than two cores (where node runs files in
    # parallel) one file's followers would move another's count. And a test
    # that hangs fails after 5 minutes instead of holding CI to its limit.
    local flags=()
    node --help 2>/dev/null | grep -q -- '--test-concurrency' && flags+=(--test-concurrency=1)
    node --help 2>/dev/null | grep -q -- '--test-timeout' && flags+=(--test-timeout=300000)
    (cd "$dir" && as_run_user env PG_IDEM_TEST_DSN="host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" \
        node --test "${flags[@]}" test/*.test.js) >"$log" 2>&1
    local rc=$?
    grep -E '^# Subtest|^ *not ok|^# (tests|pass|fail|skipped)' "$log" | tail -n 60
    [ "$rc" -ne 0 ] && grep -B2 -A25 '^ *not ok' "$log" | head -n 150
    ok=$(grep -oE '^# pass [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
    bad=$(grep -oE '^# fail [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
    skipped=$(grep -oE '^# skipped [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
    ok=${ok:-0} bad=${bad:-0} skipped=${skipped:-0}
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    # The integration tests skip without a database: here that is a failure.
    [ "$skipped" -gt 0 ] && bad=$((bad + skipped)) && echo "node: $skipped tests were skipped"
    count "Node client" "$ok" "$bad"

    run_demo_storm Node "node $WORK/src/client/node/examples/demo-server.js"
}
