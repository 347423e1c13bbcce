# Sourced by tests/suites/65_pooling.sh: a PgBouncer in pool_mode =
# transaction in front of the test cluster, with its own configuration and
# auth file in $WORK/pgbouncer, on a free port, run as the run user.
# Uses free_port, as_run_user, run_user, $WORK, $PGPORT (tests/lib.sh).
#
# trust authentication; roles other than the run user (the examples create
# their own) are looked up with auth_query as the run user. Startup
# "options" (PGOPTIONS) are dropped, not refused: the examples pass
# client_min_messages that way.
#
# The pool is smaller than the number of clients the suite opens, so
# server connections really are shared between client connections (and
# a client's consecutive transactions land on different backends).

PGBOUNCER=${PGBOUNCER:-/usr/sbin/pgbouncer}

# Start it; sets PGBOUNCER_PORT. Returns non-zero when it does not come up.
# A port free_port found free can be taken before PgBouncer binds it (by
# another run picking the same one): up to three ports are tried, each
# given 20 s to answer.
start_pgbouncer() {
    local attempt
    for attempt in 1 2 3; do
        start_pgbouncer_on "$(free_port)" && return 0
        echo "pgbouncer: attempt $attempt on port $PGBOUNCER_PORT failed; its log:" >&2
        tail -n 20 "$WORK/pgbouncer/pgbouncer.log" >&2
        stop_pgbouncer
    done
    return 1
}

start_pgbouncer_on() {   # PORT
    local dir=$WORK/pgbouncer user i
    user=$(run_user)
    mkdir -p "$dir"
    PGBOUNCER_PORT=$1
    export PGBOUNCER_PORT
    # trust: no password is checked, but the user must be in the auth file.
    printf '"%s" ""\n' "$user" >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$WORK port=$PGPORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $user
auth_user = $user
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-8}
reserve_pool_size = 0
max_client_conn = 400
max_db_connections = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits, options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    [ "$(id -u)" = 0 ] && chown -R "$user": "$dir"
    as_run_user "$PGBOUNCER" -d -q "$dir/pgbouncer.ini" || return 1
    for i in $(seq 1 200); do
        as_run_user "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PGBOUNCER_PORT" -d postgres \
            -c "SELECT 1" >/dev/null 2>&1 && return 0
        # Gone (its port taken, its configuration refused): no use waiting.
        if [ -f "$dir/pgbouncer.pid" ]; then
            kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || return 1
        elif [ "$i" -gt 20 ]; then
            return 1
        fi
        sleep 0.1
    done
    return 1
}

# Stop it (by its own pid file) if it runs.
stop_pgbouncer() {
    local pidfile=$WORK/pgbouncer/pgbouncer.pid pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    rm -f "$pidfile"
    true
}

# Run a command as the run user with libpq pointed at PgBouncer, and
# createdb / dropdb going to the server directly: a database cannot be
# dropped through a pooler that keeps server connections to it open (and
# dropdb --force closes them).
as_run_user_via_pgbouncer() {
    local shims=$WORK/pgbouncer/bin
    if [ ! -d "$shims" ]; then
        mkdir -p "$shims"
        printf '#!/bin/sh\nexec "%s/createdb" -h "%s" -p "%s" "$@"\n' "$PG_BIN" "$PGHOST" "$PGPORT" >"$shims/createdb"
        printf '#!/bin/sh\nexec "%s/dropdb" --force -h "%s" -p "%s" "$@"\n' "$PG_BIN" "$PGHOST" "$PGPORT" >"$shims/dropdb"
        chmod 755 "$shims"/*
        [ "$(id -u)" = 0 ] && chown -R "$(run_user)": "$shims"
    fi
    local env_args=(PATH="$shims:$PG_BIN:$PATH" PGHOST=127.0.0.1 PGPORT="$PGBOUNCER_PORT"
                    PGUSER="$PGUSER" PGDATABASE="$PGDATABASE" HOME="$WORK")
    if [ "$(id -u)" = 0 ]; then
        # From the scratch directory: the caller's may be one postgres
        # cannot enter (see as_run_user in tests/lib.sh).
        (cd "$WORK" && exec runuser -u postgres -- env "${env_args[@]}" "$@")
    else
        env "${env_args[@]}" "$@"
    fi
}
