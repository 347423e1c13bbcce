# Sourced by tests/suites/66_sql_edition.sh: a server as a managed service
# runs one, for the SQL edition.  Its own copy of the PostgreSQL under
# test without pg_idem's library and scripts (so that the name pg_idem is
# free for pg_tle to serve), with pg_tle built from the vendored upstream
# source (../shared/vendor/pg_tle-1.5.2.tar.gz) and preloaded, as RDS and
# Aurora preload it.  Uses say, as_run_user, stage_postgres, free_port,
# install_missing_packages, $WORK, $PG_MAJOR, $PG_PREFIX, $SYSTEM_PG_BIN,
# $PG_IDEM_CACHE (tests/lib.sh, tests/majors.sh).

PG_TLE_VERSION=1.5.2

# The vendored tarball: ../shared beside the project's root (beside the
# main checkout's, from a git worktree), or PG_TLE_TARBALL.
sql_edition_tarball() {
    local common
    if [ -n "${PG_TLE_TARBALL:-}" ]; then echo "$PG_TLE_TARBALL"; return; fi
    if [ -f "$ROOT/../shared/vendor/pg_tle-$PG_TLE_VERSION.tar.gz" ]; then
        echo "$ROOT/../shared/vendor/pg_tle-$PG_TLE_VERSION.tar.gz"
        return
    fi
    common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)
    echo "${common%/.git}/../shared/vendor/pg_tle-$PG_TLE_VERSION.tar.gz"
}

# pg_tle built with PGXS against the server under test, cached like the
# majors' builds: one directory per pg_tle version and server build,
# used once its build finished (.complete), one build at a time (flock).
# Prints the directory whose stage/ holds the installed files.
sql_edition_pg_tle() {
    local config="$SYSTEM_PG_BIN/pg_config" flavour dir lock rc=0
    flavour=$("$config" --version | awk '{print $2}')-$("$config" --configure | md5sum | cut -c1-8)
    dir=$PG_IDEM_CACHE/pg_tle-$PG_TLE_VERSION-pg$flavour
    [ -f "$dir/.complete" ] && { echo "$dir"; return 0; }
    local tarball
    tarball=$(sql_edition_tarball)
    [ -f "$tarball" ] || { echo "pg_tle's source is missing: $tarball" >&2; return 1; }
    install_missing_packages flex libkrb5-dev >&2   # flex: its guc-file.l; libkrb5-dev: gssapi.h, which libpq-be.h includes
    mkdir -p "$PG_IDEM_CACHE"
    exec {lock}>"$PG_IDEM_CACHE/.lock-pg_tle"
    flock "$lock"
    if [ ! -f "$dir/.complete" ]; then
        echo "building pg_tle $PG_TLE_VERSION for $("$config" --version) into $dir (once)" >&2
        rm -rf "$dir" && mkdir -p "$dir/src" &&
            tar -xzf "$tarball" -C "$dir/src" --strip-components=1 &&
            make -C "$dir/src" -s PG_CONFIG="$config" with_llvm=no >"$dir/build.log" 2>&1 &&
            make -C "$dir/src" -s PG_CONFIG="$config" with_llvm=no DESTDIR="$dir/stage" install >>"$dir/build.log" 2>&1 &&
            date >"$dir/.complete" || { tail -n 30 "$dir/build.log" >&2; rc=1; }
    fi
    exec {lock}>&-
    [ "$rc" -eq 0 ] && echo "$dir"
    return $rc
}

# The installation ($WORK/pg_sql; pg_tle in it unless SQL_EDITION_TLE=f)
# and a cluster ($WORK/sql_data) on its
# own port, with its socket in $WORK beside the test cluster's; sets
# SQL_PORT and SQL_BIN.  The superuser is the run user, as on the test
# cluster; the SQL edition is installed and used by roles that are not.
sql_edition_start_server() {
    local tle='' stage=$WORK/pg_sql
    if [ "${SQL_EDITION_TLE:-t}" = t ]; then tle=$(sql_edition_pg_tle) || return 1; fi
    stage_postgres "$stage"
    [ -n "$tle" ] && cp -a "$tle/stage/." "$stage/"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$stage"
    if [ -n "$PG_PREFIX" ]; then SQL_BIN=$stage$PG_PREFIX/bin; else SQL_BIN=$stage/usr/lib/postgresql/$PG_MAJOR/bin; fi
    SQL_PORT=$(free_port)
    export SQL_BIN SQL_PORT
    as_run_user "$SQL_BIN/initdb" -D "$WORK/sql_data" -A trust -U "$PGUSER" -E UTF8 \
        --locale=C.UTF-8 >"$WORK/sql_initdb.log" 2>&1 || { cat "$WORK/sql_initdb.log"; return 1; }
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $SQL_PORT"
        echo "unix_socket_directories = '$WORK'"
        echo "max_connections = 200"
        echo "fsync = off"
        [ -n "$tle" ] && echo "shared_preload_libraries = 'pg_tle'"
    } | as_run_user tee -a "$WORK/sql_data/postgresql.conf" >/dev/null
    as_run_user "$SQL_BIN/pg_ctl" -D "$WORK/sql_data" -l "$WORK/sql_server.log" -w start >/dev/null ||
        { tail -n 30 "$WORK/sql_server.log"; return 1; }
}

sql_edition_stop_server() {
    [ -f "$WORK/sql_data/postmaster.pid" ] &&
        as_run_user "$SQL_BIN/pg_ctl" -D "$WORK/sql_data" -m fast -w stop >/dev/null 2>&1
    true
}

# psql on the SQL edition's server: sql_psql ROLE DB [psql args...]
sql_psql() {
    local role=$1 db=$2
    shift 2
    as_run_user "$SQL_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$SQL_PORT" -U "$role" -d "$db" "$@"
}
