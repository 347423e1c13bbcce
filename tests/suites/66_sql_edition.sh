# Suite of tests/run.sh: the SQL edition (extension/sql_edition/), on a
# server of its own as a managed service runs one (tests/sql_edition/
# server.sh: no pg_idem library, pg_tle preloaded).  Sourced; uses count,
# say, skip_suite, as_run_user, $WORK, $PGUSER, $PGPORT (the test
# cluster, where the C edition runs, for the catalog comparison).
#
# Roles, as on a managed service: the superuser only creates pg_tle in
# template1 and the roles below.
#   idem_installer   CREATEROLE, CREATEDB, a member of pgtle_admin: the
#                    rds_superuser-like role.  It registers the SQL edition
#                    with pg_tle (pgtle.install_extension) in template1, so
#                    every new database can CREATE EXTENSION pg_idem, creates
#                    the extension in the databases of the pg_regress and
#                    isolation runs (which creates idem_client and
#                    idem_admin), and updates it (pgtle.install_update_path).
#                    The tests themselves run as the superuser: they create
#                    roles and SET ROLE to them, which a CREATEROLE role of
#                    PostgreSQL 15 may not; what they call runs as the
#                    extension's owner, idem_installer.
#   idem_owner       no attribute at all: owns a database and installs the
#                    plain script there (psql -f); runs the pg_regress
#                    tests that create no role.
#
# The tests are the C edition's own (sql/, tests/isolation/), those whose
# contract the SQL edition keeps; where an output differs on purpose, the
# expected file of tests/sql_edition/expected/ (or isolation/expected/)
# replaces the C edition's, and the guide's table
# (docs/guides/managed-postgresql.md) says why.

# pg_regress tests run against the SQL edition: all but those of the C
# edition's direct table access, maintenance under the library and
# shared-memory counters, and keys (it creates a SQL_ASCII database from
# template0, where pg_tle has registered nothing).
SQL_EDITION_REGRESS="key_vectors claims lifetime in_transaction scopes scope_role_identity
evict_every_scope replay_toasted_body settings_bytes outbox outbox_scope outbox_drain_bad_input
outbox_drain_scope outbox_drain_transactions inbox attempts attempts_scope hostile_attempts
version_guard restricted_operations trigger_function_privileges redrive"

# Of those, the ones that create no role (the plain script's run as a role
# without any attribute).
SQL_EDITION_REGRESS_PLAIN="key_vectors in_transaction replay_toasted_body settings_bytes
outbox inbox attempts version_guard"

# The isolation specs of the races the SQL edition answers as the C
# edition does, and its own (tests/sql_edition/isolation/specs/) where it
# does not.
SQL_EDITION_ISOLATION="claim_first claim_two_stealers claim_concurrent_steals claim_stale_finalize
claim_steal_vs_renew claim_renew_vs_finalize claim_fenced_finalize claim_cooldown_claimants
claim_cleanup_races claim_deleted_while_waiting claim_generation_after_release claim_in_transaction
claim_repeatable_read claim_serializable claim_followers claim_wait_wakeup claim_wait_cancel claim_lock_wait
inbox_scope_no_blocking outbox_drainers outbox_stale_ack outbox_claim_skips
outbox_key_order_producer outbox_key_order_commit attempt_duplicate_open attempt_late_put attempt_replace_race
attempt_scope_no_blocking attempt_version_guard_race attempt_wrong_digest attempt_export_mismatch redrive_races
sql_inbox_delivery"

suite_sql_edition() {
    . "$WORK/src/tests/sql_edition/server.sh"
    local out=$WORK/sql_edition log=$WORK/sql_edition.log
    # pg_tle 1.5.2, the newest release, predates PostgreSQL 19: it does not
    # build against 19's headers (FuncnameGetCandidates and
    # CreateSchemaCommand take other arguments, tuplestore_putvalues moved).
    # There the plain script runs alone (as on Cloud SQL, Azure, Neon,
    # Supabase): every part of this suite but pg_tle's install, update and
    # guide steps and the storms (whose databases install the extension by
    # CREATE EXTENSION, which only pg_tle serves).  SQL_EDITION_PLAIN_ONLY=1
    # runs that mode on any major.
    SQL_EDITION_TLE=t
    if [ "${PG_MAJOR%%.*}" -ge 19 ] 2>/dev/null; then
        SQL_EDITION_TLE=f
        say "SQL edition: the plain script only, on a server without pg_tle (pg_tle $PG_TLE_VERSION does not build against PostgreSQL $PG_MAJOR)"
    elif [ "${SQL_EDITION_PLAIN_ONLY:-0}" = 1 ]; then
        SQL_EDITION_TLE=f
        say "SQL edition: the plain script only, on a server without pg_tle (SQL_EDITION_PLAIN_ONLY=1)"
    else
        say "SQL edition: the scripts (extension/sql_edition/build.py), a server with pg_tle"
    fi
    as_run_user mkdir -p "$out"
    if ! (cd "$WORK/src" && as_run_user python3 extension/sql_edition/build.py plain "$out/pg_idem_sql.sql" &&
          as_run_user python3 extension/sql_edition/build.py tle "$out/pg_idem_tle.sql") >"$log" 2>&1; then
        cat "$log"
        count "SQL edition: build" 0 1
        return
    fi
    if ! sql_edition_start_server >>"$log" 2>&1; then
        cat "$log"
        count "SQL edition: server" 0 1
        return
    fi
    if [ "$SQL_EDITION_TLE" = f ]; then
        if ! sql_edition_setup_plain >>"$log" 2>&1; then
            cat "$log"
            count "SQL edition: install (plain script as idem_owner and as the superuser)" 0 1
            sql_edition_stop_server
            return
        fi
        count "SQL edition: install (plain script as idem_owner and as the superuser)" 1 0
        sql_edition_catalog
        sql_edition_pg_regress "plain script" idem_owner idem_sql_plain $SQL_EDITION_REGRESS_PLAIN
        sql_edition_isolation
        sql_edition_tap
        sql_edition_stop_server
        return
    fi
    if ! sql_edition_setup >>"$log" 2>&1; then
        cat "$log"
        count "SQL edition: install (pg_tle as idem_installer, plain script as idem_owner)" 0 1
        sql_edition_stop_server
        return
    fi
    count "SQL edition: install (pg_tle as idem_installer, plain script as idem_owner)" 1 0

    sql_edition_catalog
    sql_edition_update
    sql_edition_pg_regress "pg_tle" "$PGUSER" idem_sql_tle $SQL_EDITION_REGRESS
    sql_edition_pg_regress "plain script" idem_owner idem_sql_plain $SQL_EDITION_REGRESS_PLAIN
    sql_edition_isolation
    sql_edition_tap
    sql_edition_docs
    sql_edition_storms
    sql_edition_stop_server
}

# The SQL edition's TAP tests (tests/sql_edition/t): killed sessions and
# a crash of the server; and the C edition's hostile schema and hostile
# roles (tests/t/070, 073), which take the plain script for the extension
# when IDEM_SQL_SCRIPT names it.  On nodes of this installation (no
# pg_idem library).
sql_edition_tap() {
    local log=$WORK/sql_tap.log tests bad
    say "SQL edition: TAP (tests/sql_edition/t, tests/t/070_hostile_schema.pl, tests/t/073_hostile_roles.pl)"
    as_run_user env IDEM_SQL_SCRIPT="$WORK/sql_edition/pg_idem_sql.sql" \
        make -C "$WORK/src" -s PG_CONFIG="$SQL_BIN/pg_config" installcheck REGRESS= ISOLATION= \
        PROVE_TESTS='tests/sql_edition/t/*.pl tests/t/070_hostile_schema.pl tests/t/073_hostile_roles.pl' \
        PROVE_FLAGS=-v >"$log" 2>&1
    local rc=$?
    grep -E '^(ok|not ok) [0-9]' "$log"
    tests=$(grep -oE 'Tests=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    bad=$(grep -cE '^not ok [0-9]' "$log")
    tests=${tests:-0}
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
        bad=1
        tail -n 60 "$log"
    fi
    count "SQL edition: TAP" $((tests - bad > 0 ? tests - bad : 0)) "$bad"
}

# The guide's steps for managed services (docs/guides/managed-postgresql.md,
# its blocks marked "sql-edition"), on this server, as the docs examples
# suite runs every other page: its database is made from a template that
# has pg_tle but no registration of the SQL edition yet (the guide makes
# that).
sql_edition_docs() {
    local log=$WORK/sql_docs.log ok bad
    say "SQL edition: the guide's steps (docs/guides/managed-postgresql.md) on this server"
    sql_psql "$PGUSER" postgres -c "CREATE DATABASE idem_docs_template TEMPLATE template0" &&
        sql_psql "$PGUSER" idem_docs_template -c "CREATE EXTENSION pg_tle" >/dev/null
    (cd "$WORK/src" && as_run_user env PGPORT="$SQL_PORT" IDEM_DOCS_SQL_EDITION=1 \
        IDEM_DOCS_TEMPLATE=idem_docs_template /usr/bin/python3 tests/docs/run_examples.py \
        docs/guides/managed-postgresql.md) >"$log" 2>&1
    local rc=$?
    grep -vE '^ok ' "$log"
    ok=$(grep -oE '^docs examples: [0-9]+ passed' "$log" | grep -oE '[0-9]+')
    bad=$(grep -oE '^docs examples: [0-9]+ passed, [0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    ok=${ok:-0} bad=${bad:-0}
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "SQL edition: the guide's steps" "$ok" "$bad"
}

# An update through pg_tle, as idem_installer: pgtle.install_update_path
# with what every update of the SQL edition does (its internals and every
# function made again, the privileges again; build.py tle-update), from
# this version to a test version, with keys in flight.  The pending claim
# is finished by its owner after the update, the finished one replays,
# and the catalog is still the C edition's.
sql_edition_update() {
    local db=idem_sql_update out=$WORK/sql_update.txt ok=0 bad=0
    say "SQL edition: an update through pgtle.install_update_path, as idem_installer, with keys in flight"
    (cd "$WORK/src" && as_run_user python3 extension/sql_edition/build.py tle-update \
        "$(sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" extension/pg_idem.control)" 99.0.0-update-check \
        "$WORK/sql_edition/pg_idem_tle_update.sql") &&
    sql_psql "$PGUSER" postgres -c "CREATE DATABASE $db OWNER idem_installer" &&
    sql_psql idem_installer "$db" -At -v update_script="$WORK/sql_edition/pg_idem_tle_update.sql" >"$out" 2>&1 <<'SQL' || { cat "$out"; count "SQL edition: pg_tle update path" 0 1; return; }
CREATE SCHEMA idem;
CREATE EXTENSION pg_idem SCHEMA idem;
SET search_path = idem;
CREATE TEMP TABLE before_update AS
SELECT c.claim_id FROM idem_claim(idem_key('u', 'POST', '/p', 'in-flight'), idem_request_hash('a')) c;
SELECT idem_finalize(idem_key('u', 'POST', '/p', 'done'), claim_id, 201, NULL, 'paid')
  FROM idem_claim(idem_key('u', 'POST', '/p', 'done'), idem_request_hash('a'));
\i :update_script
ALTER EXTENSION pg_idem UPDATE TO '99.0.0-update-check';
SELECT 'version ' || extversion FROM pg_extension WHERE extname = 'pg_idem';
SELECT 'finalized after the update: ' || idem_finalize(idem_key('u', 'POST', '/p', 'in-flight'), claim_id, 200, NULL, 'ok')
  FROM before_update;
SELECT 'replays after the update: ' || outcome || ' ' || convert_from(response_body, 'UTF8')
  FROM idem_claim(idem_key('u', 'POST', '/p', 'done'), idem_request_hash('a'));
SQL
    cat "$out"
    for want in "version 99.0.0-update-check" "finalized after the update: true" "replays after the update: replay paid"; do
        if grep -qx "$want" "$out"; then ok=$((ok + 1)); else echo "FAIL: no \"$want\""; bad=$((bad + 1)); fi
    done
    sql_psql idem_installer "$db" -At -v schema=idem -f "$WORK/src/tests/sql_edition/catalog.sql" >"$WORK/sql_catalog_update.txt" 2>&1
    if diff -u "$WORK/sql_catalog_c.txt" "$WORK/sql_catalog_update.txt" >"$WORK/sql_catalog_update.diff"; then
        echo "ok   the updated catalog is the C edition's"
        ok=$((ok + 1))
    else
        echo "FAIL the updated catalog differs from the C edition's:"
        head -n 60 "$WORK/sql_catalog_update.diff"
        bad=$((bad + 1))
    fi
    count "SQL edition: pg_tle update path" "$ok" "$bad"
}

# The pooling suite's duplicate storms of the three clients' one-line
# setups (tests/pooling/), direct and behind PgBouncer in transaction
# mode, pointed at this server: every database they make from template1
# (and postgres, where the Python storm runs) has pg_tle's registration of
# the SQL edition, so their CREATE EXTENSION pg_idem installs it.
sql_edition_storms() {
    local saved=$PGPORT script name
    [ -f "$WORK/src/tests/pooling/pgbouncer.sh" ] || return 0
    PGPORT=$SQL_PORT
    # Their counts say they ran against the SQL edition.
    eval "$(declare -f count | sed '1s/^count/sql_edition_count/')"
    count() { sql_edition_count "SQL edition: $1" "$2" "$3"; }
    . "$WORK/src/tests/pooling/pgbouncer.sh"
    say "SQL edition: the clients' storms (tests/pooling), PgBouncer in transaction mode"
    if ! start_pgbouncer; then
        count "pgbouncer start" 0 1
        eval "$(declare -f sql_edition_count | sed '1s/^sql_edition_count/count/')"
        PGPORT=$saved
        return
    fi
    if as_run_user timeout 300 "${PYTHON:-/usr/bin/python3}" "$WORK/src/tests/pooling/python_storm.py" \
            --dsn "host=$WORK port=$PGPORT user=$PGUSER dbname=postgres" --pgbouncer "$PGBOUNCER" \
            >"$WORK/sql_storm_python.log" 2>&1; then
        cat "$WORK/sql_storm_python.log"
        count "Python storm" 1 0
    else
        cat "$WORK/sql_storm_python.log"
        count "Python storm" 0 1
    fi
    for script in "$WORK"/src/tests/pooling/storm_*.sh; do
        [ -f "$script" ] || continue
        . "$script"
        name=$(basename "$script" .sh)
        "$name"
    done
    stop_pgbouncer
    . "$WORK/src/tests/pooling/node_storm.sh"
    pooling_node_storm
    eval "$(declare -f sql_edition_count | sed '1s/^sql_edition_count/count/')"
    PGPORT=$saved
}

# Roles, pg_tle in template1, the SQL edition registered there by
# idem_installer, and the plain script's database, installed by idem_owner.
sql_edition_setup() {
    sql_psql "$PGUSER" template1 <<'SQL'
CREATE EXTENSION pg_tle;
CREATE ROLE idem_installer LOGIN CREATEROLE CREATEDB;
GRANT pgtle_admin TO idem_installer;
CREATE ROLE idem_owner LOGIN;
SQL
    sql_psql "$PGUSER" postgres -c "CREATE EXTENSION pg_tle" || return 1
    sql_psql idem_installer template1 -f "$WORK/sql_edition/pg_idem_tle.sql" >/dev/null &&
        sql_psql idem_installer postgres -f "$WORK/sql_edition/pg_idem_tle.sql" >/dev/null || return 1
    # The plain script: the roles exist by now (the pg_tle install of the
    # catalog comparison creates them, as idem_installer may); a role
    # without CREATEROLE cannot create them, and the script says so.
    sql_psql idem_installer template1 -c "CREATE DATABASE idem_sql_catalog" &&
        sql_psql idem_installer idem_sql_catalog -c "CREATE SCHEMA idem" -c "CREATE EXTENSION pg_idem SCHEMA idem" || return 1
    sql_psql "$PGUSER" postgres -c "CREATE DATABASE idem_sql_plain OWNER idem_owner" || return 1
    sql_psql idem_owner idem_sql_plain -v schema=public -f "$WORK/sql_edition/pg_idem_sql.sql" >/dev/null || return 1
    # The databases of pg_regress and the isolation tester, made as they
    # make theirs (their own way needs a superuser: ALTER DATABASE SET
    # lc_messages), owned by idem_installer, who creates the extension.
    local db
    for db in idem_sql_tle idem_sql_isolation; do
        sql_psql "$PGUSER" postgres -c "CREATE DATABASE $db OWNER idem_installer" \
            -c "ALTER DATABASE $db SET lc_messages TO 'C'" -c "ALTER DATABASE $db SET lc_monetary TO 'C'" \
            -c "ALTER DATABASE $db SET lc_numeric TO 'C'" -c "ALTER DATABASE $db SET lc_time TO 'C'" \
            -c "ALTER DATABASE $db SET bytea_output TO 'hex'" -c "ALTER DATABASE $db SET timezone_abbreviations TO 'Default'" &&
            sql_psql idem_installer "$db" -c "CREATE EXTENSION pg_idem" || return 1
    done
    # The specs' followers wait on dblink connections (a superuser's, as
    # on a managed service that lists it).
    sql_psql "$PGUSER" idem_sql_isolation -c "CREATE EXTENSION dblink" || return 1
    sql_psql "$PGUSER" postgres -c "ALTER DATABASE idem_sql_plain SET lc_messages TO 'C'" \
        -c "ALTER DATABASE idem_sql_plain SET bytea_output TO 'hex'" \
        -c "ALTER DATABASE idem_sql_plain SET timezone_abbreviations TO 'Default'"
}

# Without pg_tle: the plain script as idem_owner (a role without any
# attribute) in idem_sql_plain, as sql_edition_setup does it, and as the
# superuser in the isolation specs' database (the script creates
# idem_client and idem_admin, which idem_owner may not).
sql_edition_setup_plain() {
    sql_psql "$PGUSER" postgres -c "CREATE ROLE idem_owner LOGIN" || return 1
    sql_psql "$PGUSER" postgres -c "CREATE DATABASE idem_sql_isolation" \
        -c "ALTER DATABASE idem_sql_isolation SET lc_messages TO 'C'" || return 1
    sql_psql "$PGUSER" idem_sql_isolation -v schema=public -f "$WORK/sql_edition/pg_idem_sql.sql" >/dev/null &&
        sql_psql "$PGUSER" idem_sql_isolation -c "CREATE EXTENSION dblink" || return 1
    sql_psql "$PGUSER" postgres -c "CREATE DATABASE idem_sql_plain OWNER idem_owner" || return 1
    sql_psql idem_owner idem_sql_plain -v schema=public -f "$WORK/sql_edition/pg_idem_sql.sql" >/dev/null || return 1
    sql_psql "$PGUSER" postgres -c "ALTER DATABASE idem_sql_plain SET lc_messages TO 'C'" \
        -c "ALTER DATABASE idem_sql_plain SET bytea_output TO 'hex'" \
        -c "ALTER DATABASE idem_sql_plain SET timezone_abbreviations TO 'Default'"
}

# The pg_regress input for the SQL edition: the C edition's sql/ and
# expected/, with tests/sql_edition/expected/ replacing a file (and the
# C edition's alternatives of it).  psql runs with SHOW_CONTEXT=never:
# PL/pgSQL adds CONTEXT lines (the internal function's line) to every
# error, which are no part of the contract.
sql_edition_regress_input() {   # DIR SQLDIR EXPECTEDDIR OVERRIDEDIR
    local dir=$1 f base
    as_run_user mkdir -p "$dir/sql" "$dir/expected" "$dir/specs" "$dir/bin"
    [ -d "$2" ] && as_run_user cp "$2"/* "$dir/$(basename "$2")/"
    as_run_user cp "$3"/*.out "$dir/expected/"
    # The SQL edition's own specs (races where it differs on purpose).
    [ -d "$4/specs" ] && as_run_user cp "$4"/specs/*.spec "$dir/specs/"
    for f in "$4"/*.out; do
        [ -f "$f" ] || continue
        base=$(basename "$f" .out)
        as_run_user rm -f "$dir/expected/$base"_[0-9].out
        as_run_user cp "$f" "$dir/expected/$base.out"
    done
    as_run_user tee "$dir/bin/psql" >/dev/null <<WRAPPER
#!/bin/sh
exec "$SQL_BIN/psql" -v SHOW_CONTEXT=never "\$@"
WRAPPER
    as_run_user chmod 755 "$dir/bin/psql"
}

sql_edition_pg_regress() {   # LABEL ROLE DATABASE TESTS...
    local label=$1 role=$2 db=$3 dir=$WORK/sql_regress_${3} log ok bad pgxs
    shift 3
    say "SQL edition: pg_regress through the $label ($role runs the tests)"
    sql_edition_regress_input "$dir" "$WORK/src/sql" "$WORK/src/expected" "$WORK/src/tests/sql_edition/expected"
    pgxs=$(dirname "$("$SQL_BIN/pg_config" --pgxs)")/..
    log=$dir/run.log
    as_run_user "$pgxs/test/regress/pg_regress" --inputdir="$dir" --outputdir="$dir" --bindir="$dir/bin" \
        --host="$WORK" --port="$SQL_PORT" --user="$role" --use-existing --dbname="$db" "$@" >"$log" 2>&1
    local rc=$?
    grep -E '\.\.\. |^(ok|not ok) [0-9]' "$log"
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$log")
    bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]|failed \(ignored\)' "$log")
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && { tail -n 20 "$log"; bad=1; }
    [ "$bad" -gt 0 ] && [ -f "$dir/regression.diffs" ] && head -c 20000 "$dir/regression.diffs"
    count "SQL edition: pg_regress ($label)" "$ok" "$bad"
}

sql_edition_isolation() {
    local dir=$WORK/sql_isolation log ok bad pgxs
    local how="pg_tle"
    [ "$SQL_EDITION_TLE" = f ] && how="plain script"
    say "SQL edition: isolation specs through the $how"
    sql_edition_regress_input "$dir" "$WORK/src/tests/isolation/specs" "$WORK/src/tests/isolation/expected" \
        "$WORK/src/tests/sql_edition/isolation"
    pgxs=$(dirname "$("$SQL_BIN/pg_config" --pgxs)")/..
    log=$dir/run.log
    as_run_user "$pgxs/test/isolation/pg_isolation_regress" --inputdir="$dir" --outputdir="$dir" \
        --bindir="$SQL_BIN" --host="$WORK" --port="$SQL_PORT" --user="$PGUSER" \
        --use-existing --dbname=idem_sql_isolation $SQL_EDITION_ISOLATION >"$log" 2>&1
    local rc=$?
    grep -E '\.\.\. |^(ok|not ok) [0-9]' "$log"
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$log")
    bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]|failed \(ignored\)' "$log")
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && { tail -n 20 "$log"; bad=1; }
    [ "$bad" -gt 0 ] && [ -f "$dir/regression.diffs" ] && head -c 20000 "$dir/regression.diffs"
    count "SQL edition: isolation ($how)" "$ok" "$bad"
}

# The two editions' catalogs, compared: every function of the C edition
# (the test cluster, CREATE EXTENSION pg_idem) has the SQL edition's
# namesake with the same arguments, argument names, defaults and result
# (pg_tle install, and the plain script's); the tables, columns,
# constraints, indexes, views, triggers, types and grants are the same.
# Only the SQL edition's internals (idem__*) are its own.
sql_edition_catalog() {
    local q=$WORK/src/tests/sql_edition/catalog.sql c=$WORK/sql_catalog_c.txt s=$WORK/sql_catalog_sql.txt p=$WORK/sql_catalog_plain.txt
    say "SQL edition: its catalog against the C edition's"
    as_run_user "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -d postgres \
        -c "DROP DATABASE IF EXISTS idem_catalog_c" -c "CREATE DATABASE idem_catalog_c" >/dev/null &&
        as_run_user "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -d idem_catalog_c \
            -c "CREATE SCHEMA idem" -c "CREATE EXTENSION pg_idem SCHEMA idem" >/dev/null 2>&1
    as_run_user "$PG_BIN/psql" -X -q -At -h "$WORK" -p "$PGPORT" -d idem_catalog_c -v schema=idem -f "$q" >"$c" 2>&1
    sql_psql idem_owner idem_sql_plain -At -v schema=public -f "$q" >"$p" 2>&1
    local bad=0 checked=2
    if [ "$SQL_EDITION_TLE" = f ]; then
        checked=1
    elif sql_psql idem_installer idem_sql_catalog -At -v schema=idem -f "$q" >"$s" 2>&1 &&
            diff -u "$c" "$s" >"$WORK/sql_catalog.diff"; then
        echo "ok   the pg_tle install's catalog is the C edition's ($(wc -l <"$c") lines)"
    else
        echo "FAIL the pg_tle install's catalog differs from the C edition's:"
        head -n 80 "$WORK/sql_catalog.diff"
        bad=$((bad + 1))
    fi
    if diff -u "$c" "$p" >"$WORK/sql_catalog_plain.diff"; then
        echo "ok   the plain script's catalog is the C edition's"
    else
        echo "FAIL the plain script's catalog differs from the C edition's:"
        head -n 80 "$WORK/sql_catalog_plain.diff"
        bad=$((bad + 1))
    fi
    count "SQL edition: catalog against the C edition's" $((checked - bad)) "$bad"
}
