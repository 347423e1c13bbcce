# Shared by tests/run.sh, tests/demo.sh and tests/bench/run.sh: install what
# is missing, build, and run a throwaway PostgreSQL cluster.
#
# PostgreSQL refuses to run as root, so when we are root the server and
# the tests run as the unprivileged "postgres" user (created by Debian's
# postgresql package) in a private copy of the tree that user owns.

PG_MAJOR=${PG_MAJOR:-15}
PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin

# Debian packages the build, the tests, the demo and the benchmarks need.
IDEM_PACKAGES="make gcc g++ cmake pkg-config postgresql-$PG_MAJOR
postgresql-server-dev-$PG_MAJOR postgresql-client-$PG_MAJOR libpq-dev libssl-dev
libipc-run-perl libgtest-dev nlohmann-json3-dev libcpp-httplib-dev
python3 python3-psycopg"

say() { printf '\n== %s\n' "$*"; }

# Run a command as root: directly, or through sudo for a normal user.
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Install the Debian packages that are missing (apt-get update only if any is).
install_missing_packages() {
    local missing=() pkg
    for pkg in $IDEM_PACKAGES "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
}

# Build and install the extension from the tree at $1.
build_and_install_extension() {
    say "building and installing the extension"
    make -C "$1" -s PG_CONFIG="$PG_BIN/pg_config" all
    as_root make -C "$1" -s PG_CONFIG="$PG_BIN/pg_config" install >/dev/null
}

# The user the server and the tests run as.
run_user() {
    if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

# Run a command as the run user, with the cluster's environment.
as_run_user() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- env PATH="$PG_BIN:$PATH" PGHOST="$PGHOST" PGPORT="$PGPORT" \
            PGUSER="$PGUSER" PGDATABASE="$PGDATABASE" HOME="$WORK" "$@"
    else
        env PATH="$PG_BIN:$PATH" "$@"
    fi
}

# A scratch directory owned by the run user: $WORK.
make_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/pg_idem.$1.XXXXXX")
    [ "$(id -u)" = 0 ] && chown postgres: "$WORK"
    chmod 755 "$WORK"
    export WORK
}

# A copy of the source tree at $1 in $WORK/src, owned by the run user.
copy_tree() {
    mkdir -p "$WORK/src"
    (cd "$1" && tar --exclude=./.git --exclude=./build -cf - .) | (cd "$WORK/src" && tar -xf -)
    [ "$(id -u)" = 0 ] && chown -R postgres: "$WORK/src"
    true
}

# A free TCP port (the servers listen on a socket in $WORK as well).
free_port() {
    local port
    for port in $(shuf -i 20000-60000 -n 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    echo 54329
}

# Start a throwaway cluster in $WORK/data; extra postgresql.conf lines in $1.
start_cluster() {
    export PGPORT PGHOST="$WORK" PGUSER=postgres PGDATABASE=postgres
    PGPORT=$(free_port)
    [ "$(id -u)" = 0 ] || PGUSER=$(id -un)
    say "starting a throwaway cluster on port $PGPORT"
    as_run_user "$PG_BIN/initdb" -D "$WORK/data" -A trust -U "$PGUSER" -E UTF8 \
        --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log"; return 1; }
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$WORK'"
        echo "max_connections = 200"
        echo "fsync = off"
        echo "${1:-}"
    } | as_run_user tee -a "$WORK/data/postgresql.conf" >/dev/null
    as_run_user "$PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w start >/dev/null
    trap stop_cluster EXIT
}

stop_cluster() {
    [ -n "${WORK:-}" ] && [ -f "$WORK/data/postmaster.pid" ] &&
        as_run_user "$PG_BIN/pg_ctl" -D "$WORK/data" -m immediate -w stop >/dev/null 2>&1
    true
}
