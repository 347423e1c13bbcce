# Shared by tests/run.sh, tests/demo.sh and tests/bench/run.sh: install what
# is missing, build, and run a throwaway PostgreSQL cluster.
#
# Nothing is installed into the system's PostgreSQL: the extension goes
# into a private copy of the server's installation in the scratch
# directory ($WORK/pg, hard links to Debian's files where possible), and
# the throwaway cluster runs from there.  PostgreSQL finds its share and
# library directories relative to its binaries, so the copy is complete.
#
# PostgreSQL refuses to run as root, so when we are root the server and
# the tests run as the unprivileged "postgres" user (created by Debian's
# postgresql package) in a private copy of the tree that user owns.
#
# The scratch directory ($WORK) is removed when the script succeeds and
# kept, with its path printed, when it fails.

# Every cluster the harness creates is UTF8 whatever the caller's locale:
# with LANG unset (a minimal install, a CI container) initdb would make
# SQL_ASCII clusters, which the TAP tests' PostgreSQL::Test::Cluster (it
# passes no --locale) and pg_autoctl inherit.  LC_ALL covers what runs
# here; PostgreSQL::Test::Utils deletes LC_ALL, so LANG covers the TAP
# tests, and no other LC_* may override it.  tests/t/000_cluster_encoding.pl
# fails when a cluster would not be UTF8.
unset LANGUAGE LC_CTYPE LC_COLLATE LC_MESSAGES LC_MONETARY LC_NUMERIC LC_TIME
export LANG=C.UTF-8 LC_ALL=C.UTF-8

# The PostgreSQL under test: Debian 12's 15 by default; make test PG=18
# (and CASSERT=1 for an assert-enabled build) uses a build of Debian's
# source package, cached by tests/majors.sh (prepare_postgres).
DEBIAN_PG_MAJOR=15
PG_MAJOR=${PG:-${PG_MAJOR:-$DEBIAN_PG_MAJOR}}
CASSERT=${CASSERT:-0}
SYSTEM_PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
PG_BIN=$SYSTEM_PG_BIN
# Set by prepare_postgres for a cached build: its installation prefix.
PG_PREFIX=
. "$(dirname "${BASH_SOURCE[0]}")/majors.sh"

# Debian packages the build, the tests, the demo and the benchmarks need
# (Debian 12's PostgreSQL, with PL/Proxy and pg_auto_failover for it).
IDEM_PACKAGES="make gcc g++ cmake pkg-config postgresql-$DEBIAN_PG_MAJOR
postgresql-server-dev-$DEBIAN_PG_MAJOR postgresql-client-$DEBIAN_PG_MAJOR libpq-dev libssl-dev
libipc-run-perl libgtest-dev nlohmann-json3-dev libcpp-httplib-dev
python3 python3-psycopg python3-psycopg-pool python3-pytest python3-starlette
python3-fastapi python3-flask python3-httpx python3-uvicorn python3-prometheus-client
python3-setuptools python3-wheel python3-venv python3-pip nodejs
pgbouncer postgresql-$DEBIAN_PG_MAJOR-plproxy postgresql-$DEBIAN_PG_MAJOR-auto-failover
prometheus-postgres-exporter clang-tools valgrind rabbitmq-server python3-pika"

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
    say "installing ${#missing[@]} missing Debian packages with apt-get (a few minutes on a fresh machine): ${missing[*]}"
    echo "   apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    echo "   apt-get install"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
}

# Build the extension from the tree at $1 and install it into a private
# copy of the server's installation, $WORK/pg; PG_BIN then points there.
build_and_install_extension() {
    local root=$1 stage=$WORK/pg
    say "building the extension and installing it into $stage (not into the system)"
    # Objects built for another server (make test PG=18 after make test)
    # would link: start clean when the server changed.
    local built_for
    built_for="$("$SYSTEM_PG_BIN/pg_config" --version) $("$SYSTEM_PG_BIN/pg_config" --configure | md5sum | cut -c1-8)"
    if [ "$(cat "$root/.built-for" 2>/dev/null)" != "$built_for" ]; then
        make -C "$root" -s PG_CONFIG="$SYSTEM_PG_BIN/pg_config" clean >/dev/null 2>&1
        echo "$built_for" >"$root/.built-for"
    fi
    make -C "$root" -s PG_CONFIG="$SYSTEM_PG_BIN/pg_config" all
    stage_postgres "$stage"
    make -C "$root" -s PG_CONFIG="$SYSTEM_PG_BIN/pg_config" DESTDIR="$stage" install >/dev/null
    if [ -n "$PG_PREFIX" ]; then
        PG_BIN=$stage$PG_PREFIX/bin
    else
        PG_BIN=$stage/usr/lib/postgresql/$PG_MAJOR/bin
    fi
    export PG_BIN
}

# A private copy of the PostgreSQL installation at $1, laid out as under
# /: binaries and libraries hard-linked (copied across file systems),
# share copied, headers linked.  Any pg_idem file of an earlier system
# install is left out.  A cached source build (PG_PREFIX) is one
# directory; cached binary packages (PG_FROM=deb) are the usr/ tree around
# PG_PREFIX (usr/lib/postgresql/N, usr/share/postgresql/N, the headers),
# which the binaries find relative to themselves.
stage_postgres() {
    local stage=$1 lib=/usr/lib/postgresql/$PG_MAJOR share=/usr/share/postgresql/$PG_MAJOR tree
    if [ -n "$PG_PREFIX" ]; then
        tree=$PG_PREFIX
        [ "$PG_FROM" = deb ] && tree=$(cd "$PG_PREFIX/../../.." && pwd)
        share=$("$PG_PREFIX/bin/pg_config" --sharedir)
        mkdir -p "$stage$(dirname "$tree")"
        cp -al "$tree" "$stage$(dirname "$tree")/" 2>/dev/null ||
            cp -a "$tree" "$stage$(dirname "$tree")/"
        rm -rf "$stage$PG_PREFIX"/lib/pg_idem* "$stage$share"/extension/pg_idem* \
            "$stage$PG_PREFIX"/lib/bitcode/pg_idem*
        return 0
    fi
    mkdir -p "$stage/usr/lib/postgresql" "$stage/usr/share/postgresql"
    cp -al "$lib" "$stage/usr/lib/postgresql/" 2>/dev/null ||
        cp -a "$lib" "$stage/usr/lib/postgresql/"
    cp -a "$share" "$stage/usr/share/postgresql/"
    rm -f "$stage$lib"/lib/pg_idem* "$stage$share"/extension/pg_idem*
    rm -rf "$stage$lib"/lib/bitcode/pg_idem*
    ln -sfn /usr/include "$stage/usr/include"
}

# The user the server and the tests run as.
run_user() {
    if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

# Run a command as the run user, with the cluster's environment.  As root,
# from the scratch directory unless the caller is already in it (or in /):
# the caller's directory may be one postgres cannot enter (a mktemp -d,
# root's 0700 home), and initdb, pg_ctl, make and scan-build then fail.
as_run_user() {
    if [ "$(id -u)" = 0 ]; then
        (
            case $PWD in
                "$WORK" | "$WORK"/* | /) ;;
                *) cd "${WORK:-/}" || exit 1 ;;
            esac
            exec runuser -u postgres -- env PATH="$PG_BIN:$PATH" PGHOST="$PGHOST" PGPORT="$PGPORT" \
                PGUSER="$PGUSER" PGDATABASE="$PGDATABASE" HOME="$WORK" "$@"
        )
    else
        env PATH="$PG_BIN:$PATH" "$@"
    fi
}

# A scratch directory owned by the run user: $WORK.  Removed on success,
# kept on failure (finish_workdir, from the EXIT trap).
make_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/pg_idem.$1.XXXXXX")
    [ "$(id -u)" = 0 ] && chown postgres: "$WORK"
    chmod 755 "$WORK"
    export WORK
    trap 'finish_workdir $?' EXIT
}

# EXIT trap: stop the cluster, then remove $WORK, or keep it on failure
# (or with KEEP_WORK=1) and say where it is.
finish_workdir() {
    local rc=$1
    stop_cluster
    if [ "$rc" -eq 0 ] && [ "${KEEP_WORK:-0}" != 1 ]; then
        rm -rf "$WORK"
    else
        echo "scratch directory kept: $WORK" >&2
    fi
    return "$rc"
}

# A copy of the source tree at $1 in $WORK/src, owned by the run user
# (and the C++ client's kept copy refreshed, below).
copy_tree() {
    mkdir -p "$WORK/src"
    (cd "$1" && tar --exclude=./.git --exclude=./build -cf - .) | (cd "$WORK/src" && tar -xf -)
    # The tracked files, for the house rules: the copy has no .git, and the
    # suites add build output to it (an egg-info, generated scripts).
    git -C "$1" ls-files -z >"$WORK/src/.tracked-files" 2>/dev/null || rm -f "$WORK/src/.tracked-files"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$WORK/src"
    if [ -n "${PG_IDEM_CLIENT_BUILD:-}" ]; then
        mkdir -p "$PG_IDEM_CLIENT_BUILD/tree" || return 1
        (cd "$WORK/src" && tar --exclude='./client/node/node_modules' -cf - .) |
            tar -xf - -C "$PG_IDEM_CLIENT_BUILD/tree" || return 1
        [ "$(id -u)" = 0 ] && chown -R postgres: "$PG_IDEM_CLIENT_BUILD"
    fi
    true
}

# Where the C++ client (client/cpp) is configured from and built.  make
# test builds it in its scratch directory.  With PG_IDEM_CLIENT_BUILD (a
# directory kept between runs, as .ci/run's runs on several majors keep
# it) it is built there once: the client does not depend on the server's
# major, so a later run finds it built (cmake rebuilds only what changed:
# the copy of the tree it is configured from, refreshed by copy_tree,
# keeps the files' times) and runs its tests against its own server.
client_source() {
    if [ -n "${PG_IDEM_CLIENT_BUILD:-}" ]; then
        echo "$PG_IDEM_CLIENT_BUILD/tree/client/cpp"
    else
        echo "$WORK/src/client/cpp"
    fi
}
client_build() {
    if [ -n "${PG_IDEM_CLIENT_BUILD:-}" ]; then
        echo "$PG_IDEM_CLIENT_BUILD/build"
    else
        echo "$WORK/client-build"
    fi
}

# A free TCP port for a server of this run (the servers listen on a socket
# in $WORK as well).  It is picked below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range): a port in that range can be handed to any
# outgoing connection, a client's or the server's own, between this check
# and the server's bind, which then fails with "address already in use" (CI
# saw RabbitMQ's listener do that while its node talked to its own epmd).
# The Python and Node tests bind port 0 instead: Linux gives bind(0) odd
# ports and connect() even ones.  The probe below only sees a port
# something listens on, so another run can still take the same port first:
# start_rabbitmq and start_pgbouncer retry on new ones.
free_port() {
    local port low=32768 range="20000-60000"
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null
    [ "$low" -gt 12000 ] 2>/dev/null && range="10000-$((low - 1))"
    for port in $(shuf -i "$range" -n 50); do
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
}

stop_cluster() {
    [ -n "${WORK:-}" ] && [ -f "$WORK/data/postmaster.pid" ] &&
        as_run_user "$PG_BIN/pg_ctl" -D "$WORK/data" -m immediate -w stop >/dev/null 2>&1
    true
}

# The storm sender of make demo (client/cpp/examples/demo), for the suites
# that run the storm against another language's service: the C++ suite's
# build when it has one, else a build of just the demo targets. Prints its path.
demo_storm_sender() {
    local bin build=$WORK/storm-build
    bin=$(client_build)/examples/demo/idem-demo-storm
    [ -x "$bin" ] && { echo "$bin"; return 0; }
    bin=$build/examples/demo/idem-demo-storm
    [ -x "$bin" ] && { echo "$bin"; return 0; }
    as_run_user cmake -S "$WORK/src/client/cpp" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DPG_IDEM_BUILD_TESTS=OFF -DPG_IDEM_BUILD_BENCH=OFF -DPG_IDEM_BUILD_EXAMPLES=ON \
        >"$WORK/storm-build.log" 2>&1 &&
        as_run_user cmake --build "$build" -j2 --target idem-demo-storm >>"$WORK/storm-build.log" 2>&1 ||
        { tail -n 40 "$WORK/storm-build.log" >&2; return 1; }
    echo "$bin"
}

# Runs the storm against a service started by the command $2 and counts
# its expectations as suite $1 ("N of M expectations met").
run_demo_storm() {   # NAME SERVER-CMD
    local name=$1 cmd=$2 sender log="$WORK/storm-$1.log" met total
    say "storm against the $name example service"
    if ! sender=$(demo_storm_sender); then
        count "$name storm" 0 1
        return
    fi
    as_run_user bash "$WORK/src/client/cpp/examples/demo/storm.sh" \
        --dsn "host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" \
        --server-cmd "$cmd" --sender "$sender" >"$log" 2>&1
    local rc=$?
    cat "$log"
    met=$(grep -oE '^[0-9]+ of [0-9]+ expectations met' "$log" | tail -1)
    total=$(echo "$met" | awk '{print $3}')
    met=$(echo "$met" | awk '{print $1}')
    if [ -z "$met" ]; then
        count "$name storm" 0 1
    else
        local bad=$((total - met))
        [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
        count "$name storm" "$met" "$bad"
    fi
}
