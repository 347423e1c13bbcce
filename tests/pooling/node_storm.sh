# Sourced by tests/suites/65_pooling.sh: the Node storm (node_storm.js),
# the README's one-line Express setup with its defaults behind a PgBouncer
# of its own (transaction mode, pool 5). Uses count, say, as_run_user,
# install_missing_packages, $WORK, $PGHOST, $PGPORT, $PGUSER.
pooling_node_storm() {
    local dir=$WORK/src/client/node log=$WORK/pooling.node-storm.log
    [ -f "$dir/package.json" ] || return 0
    command -v npm >/dev/null || install_missing_packages npm
    # The node suite's npm ci, or ours when the pooling suite runs alone.
    if [ ! -d "$dir/node_modules/express" ] &&
       ! (cd "$dir" && as_run_user npm ci --no-audit --no-fund --loglevel=error) >"$log" 2>&1; then
        tail -n 40 "$log"
        count "pooling: Node storm (npm ci)" 0 1
        return
    fi
    say "pooling: Node storm, the one-line Express setup behind PgBouncer (pool 5)"
    if as_run_user env NODE_PATH="$dir/node_modules" PG_IDEM_STORM_HOST="$PGHOST" PG_IDEM_STORM_PORT="$PGPORT" \
            PG_IDEM_STORM_USER="$PGUSER" timeout 300 node "$WORK/src/tests/pooling/node_storm.js" >"$log" 2>&1; then
        cat "$log"
        count "pooling: Node storm" 1 0
    else
        cat "$log"
        count "pooling: Node storm" 0 1
    fi
}
