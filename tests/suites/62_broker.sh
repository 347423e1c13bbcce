# Suite of tests/run.sh: the RabbitMQ recipes of docs/guides/brokers.md
# (tests/broker/run.py) against a private RabbitMQ server from Debian's
# rabbitmq-server (tests/broker/rabbitmq.sh), in Python (Debian's
# python3-pika) and Node (amqplib from npm, pinned by
# tests/broker/package-lock.json).  Sourced; uses count, say, as_run_user,
# install_missing_packages, $WORK, $PGPORT, $PGUSER, $PYTHON.
# run.py prints "broker recipes: N passed, N failed".
suite_broker() {
    local src="$WORK/src" log="$WORK/broker.log" ok bad
    [ -f "$src/tests/broker/run.py" ] || return 0
    install_missing_packages rabbitmq-server python3-pika
    command -v npm >/dev/null || install_missing_packages npm
    . "$src/tests/broker/rabbitmq.sh"
    say "broker recipes: npm ci (amqplib) and the Node client's dependencies"
    if ! (cd "$src/tests/broker" && as_run_user npm ci --no-audit --no-fund --loglevel=error) >"$WORK/broker-npm.log" 2>&1 ||
       { [ ! -d "$src/client/node/node_modules/pg" ] &&
         ! (cd "$src/client/node" && as_run_user npm ci --no-audit --no-fund --loglevel=error) >>"$WORK/broker-npm.log" 2>&1; }; then
        tail -n 30 "$WORK/broker-npm.log"
        count "broker recipes (npm ci)" 0 1
        return
    fi
    # The broker is stopped however the run ends.
    trap 'stop_rabbitmq; finish_workdir $?' EXIT
    if ! start_rabbitmq; then
        trap 'finish_workdir $?' EXIT
        count "broker recipes (RabbitMQ start)" 0 1
        return
    fi
    say "broker recipes: consumers and relays in Python and Node, killed on purpose (log in $log)"
    (cd "$src" && as_run_user env AMQP_URL="$AMQP_URL" "${PYTHON:-/usr/bin/python3}" tests/broker/run.py) >"$log" 2>&1
    local rc=$?
    stop_rabbitmq
    trap 'finish_workdir $?' EXIT
    grep -E '^(ok|not ok|   \(|broker recipes:)' "$log" | cut -c1-400
    [ "$rc" -ne 0 ] && grep -vE '^(ok|   \(|broker recipes:)' "$log" | tail -n 60
    ok=$(grep -oE '^broker recipes: [0-9]+ passed' "$log" | grep -oE '[0-9]+')
    bad=$(grep -oE '[0-9]+ failed' "$log" | tail -1 | grep -oE '[0-9]+')
    ok=${ok:-0} bad=${bad:-0}
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "broker recipes" "$ok" "$bad"
}
