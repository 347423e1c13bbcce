# A private RabbitMQ server for the broker suite (tests/suites/62_broker.sh),
# from Debian's rabbitmq-server package.  Sourced after tests/lib.sh; uses
# as_run_user, free_port, say and $WORK.
#
# The server is the package's own, run as the run user (never root, never
# the package's system service) with everything of its own: a node name,
# the AMQP and distribution ports and an epmd (Erlang's port mapper) on a
# private port, the cookie, the data and the logs under $WORK/rabbitmq.
# So it runs beside the system's RabbitMQ, if one runs, and beside other
# runs of make test.  start_rabbitmq exports AMQP_URL; stop_rabbitmq stops
# the node and its epmd.

RABBITMQ_BIN=/usr/lib/rabbitmq/bin
EPMD=/usr/lib/erlang/bin/epmd

rabbitmq_env() {   # the environment every RabbitMQ command of this run needs
    local d=$WORK/rabbitmq
    echo "HOME=$d RABBITMQ_NODENAME=$RABBITMQ_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1"
    echo "RABBITMQ_NODE_PORT=$RABBITMQ_PORT RABBITMQ_DIST_PORT=$RABBITMQ_DIST_PORT"
    echo "ERL_EPMD_PORT=$RABBITMQ_EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1"
    echo "RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_PID_FILE=$d/rabbit.pid"
    echo "RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins RABBITMQ_CONFIG_FILE=$d/rabbitmq"
    echo "RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf"
}

rabbitmq() {   # rabbitmq COMMAND ARGS...: one of the package's scripts, as the run user
    local cmd=$1
    shift
    # shellcheck disable=SC2046
    as_run_user env $(rabbitmq_env) "$RABBITMQ_BIN/$cmd" "$@"
}

# Any of its three ports can be taken by another run between free_port's
# check and the node's bind ("eaddrinuse" in server.out, and the node
# exits): up to three sets of ports are tried, each on a new node name
# (so on new data).
start_rabbitmq() {
    local attempt
    for attempt in 1 2 3; do
        start_rabbitmq_once && return 0
        echo "rabbitmq: attempt $attempt on ports $RABBITMQ_PORT, $RABBITMQ_DIST_PORT, $RABBITMQ_EPMD_PORT failed" >&2
    done
    return 1
}

start_rabbitmq_once() {
    local d=$WORK/rabbitmq
    RABBITMQ_NODE="idem$$x$RANDOM@localhost"
    RABBITMQ_PORT=$(free_port)
    RABBITMQ_DIST_PORT=$(free_port)
    RABBITMQ_EPMD_PORT=$(free_port)
    mkdir -p "$d/log"
    rm -f "$d/rabbit.pid"                              # a failed attempt's
    echo '[].' >"$d/enabled_plugins"                  # no plugins: AMQP 0-9-1 only
    : >"$d/rabbitmq-env.conf"                          # not /etc/rabbitmq's
    echo 'loopback_users = none' >"$d/rabbitmq.conf"   # guest, from 127.0.0.1 only (the listener's address)
    echo '[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}].' >"$d/advanced.config"
    [ "$(id -u)" = 0 ] && chown -R "$(run_user):" "$d"
    say "starting RabbitMQ $(dpkg-query -W -f='${Version}' rabbitmq-server) as $RABBITMQ_NODE on port $RABBITMQ_PORT (data and logs in $d)"
    rabbitmq rabbitmq-server >"$d/log/server.out" 2>&1 &
    if ! rabbitmq rabbitmqctl wait --timeout 180 "$d/rabbit.pid" >"$d/log/wait.out" 2>&1; then
        tail -n 30 "$d/log/wait.out" "$d/log/server.out"
        stop_rabbitmq
        return 1
    fi
    export AMQP_URL="amqp://guest:guest@127.0.0.1:$RABBITMQ_PORT/%2F"
}

stop_rabbitmq() {
    local d=$WORK/rabbitmq pid
    [ -n "${RABBITMQ_NODE:-}" ] || return 0
    rabbitmq rabbitmqctl stop "$d/rabbit.pid" >"$d/log/stop.out" 2>&1
    pid=$(cat "$d/rabbit.pid" 2>/dev/null)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    as_run_user env ERL_EPMD_PORT="$RABBITMQ_EPMD_PORT" "$EPMD" -kill >/dev/null 2>&1
    RABBITMQ_NODE=
}
