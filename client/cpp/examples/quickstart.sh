#!/usr/bin/env bash
# ctest "quickstart": idem_quickstart as the documented application role.
#
#   quickstart.sh BIN        # PG_IDEM_TEST_DSN names the server (else skipped, 77)
#
# As an administrator: a fresh database idem_quickstart with pg_idem, the
# role idem_quickstart_app with only idem_client (no CREATE anywhere, not
# even TEMP), and the quickstart's table with INSERT granted.  Then, as
# that role: the first run must answer 201 twice by running the handlers,
# the second 201 twice by replaying; against a database without pg_idem
# the program must fail and print the database error; against one without
# the administrator's table it must exit 1 (not abort) and print what to
# do.  Everything is dropped however it ends.
set -euo pipefail

BIN=$(realpath "$1")
if [ -z "${PG_IDEM_TEST_DSN:-}" ]; then
    echo "quickstart.sh: PG_IDEM_TEST_DSN is not set, skipped"
    exit 77
fi
PSQL=psql
[ -x "/usr/lib/postgresql/${PG_MAJOR:-15}/bin/psql" ] && PSQL=/usr/lib/postgresql/${PG_MAJOR:-15}/bin/psql
ADMIN=$PG_IDEM_TEST_DSN
APP="$ADMIN dbname=idem_quickstart user=idem_quickstart_app"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/pg_idem.quickstart.XXXXXX")

admin() { PGOPTIONS=--client-min-messages=warning "$PSQL" -X -q -v ON_ERROR_STOP=1 -d "$ADMIN" "$@" >/dev/null; }
cleanup() {
    local rc=$?
    for db in idem_quickstart idem_quickstart_bare idem_quickstart_notable; do
        admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
    done
    admin -c "DROP ROLE IF EXISTS idem_quickstart_app" || true
    rm -rf "$OUT"
    exit "$rc"
}
trap cleanup EXIT
fail() { echo "quickstart.sh: FAILED: $*"; sed 's/^/  | /' "$OUT"/run.* 2>/dev/null; exit 1; }

admin -c "DROP DATABASE IF EXISTS idem_quickstart WITH (FORCE)" \
      -c "DROP DATABASE IF EXISTS idem_quickstart_bare WITH (FORCE)" \
      -c "DROP DATABASE IF EXISTS idem_quickstart_notable WITH (FORCE)" \
      -c "DROP ROLE IF EXISTS idem_quickstart_app" \
      -c "CREATE DATABASE idem_quickstart" -c "CREATE DATABASE idem_quickstart_bare" \
      -c "CREATE DATABASE idem_quickstart_notable" \
      -c "CREATE ROLE idem_quickstart_app LOGIN"
for db in idem_quickstart idem_quickstart_bare idem_quickstart_notable; do
    admin -c "REVOKE CREATE, TEMPORARY ON DATABASE $db FROM PUBLIC"
done
# The admin step the quickstart's comment shows.
admin -d "$ADMIN dbname=idem_quickstart" -c "CREATE EXTENSION pg_idem" \
      -c "GRANT idem_client TO idem_quickstart_app" \
      -c "CREATE TABLE quickstart_payments (amount int, generation bigint)" \
      -c "GRANT INSERT ON quickstart_payments TO idem_quickstart_app"

# The role really has no CREATE anywhere.
[ "$("$PSQL" -X -At -d "$APP" -c "SELECT has_database_privilege('idem_quickstart', 'CREATE')
       OR has_database_privilege('idem_quickstart', 'TEMPORARY')
       OR has_schema_privilege('public', 'CREATE')")" = f ] || fail "the role may create objects"

"$BIN" "$APP" >"$OUT/run.1" 2>&1 || fail "first run exited $?"
grep -qx 'lease mode: 201 {"id": 1, "generation": [0-9]*}' "$OUT/run.1" || fail "first run, lease mode"
grep -qx 'in-transaction: 201 {"id": 2}' "$OUT/run.1" || fail "first run, in-transaction"
grep -qx 'idem_client_requests_total{outcome="won_completed"} 2' "$OUT/run.1" || fail "first run, metrics"
"$BIN" "$APP" >"$OUT/run.2" 2>&1 || fail "second run exited $?"
grep -qx 'lease mode: 201 .* (replayed)' "$OUT/run.2" || fail "second run, lease mode not replayed"
grep -qx 'in-transaction: 201 {"id": 2} (replayed)' "$OUT/run.2" || fail "second run, in-transaction not replayed"
grep -qx 'idem_client_requests_total{outcome="replay"} 2' "$OUT/run.2" || fail "second run, metrics"
rows=$("$PSQL" -X -At -d "$ADMIN dbname=idem_quickstart" -c "SELECT count(*) FROM quickstart_payments")
[ "$rows" = 1 ] || fail "$rows payment rows, expected 1"

# Without the extension: a non-zero exit and the database's own words.
if "$BIN" "$ADMIN dbname=idem_quickstart_bare user=idem_quickstart_app" >"$OUT/run.bare" 2>&1; then
    fail "the run against a database without pg_idem succeeded"
fi
grep -q 'error: .*idem_' "$OUT/run.bare" || fail "no database error printed without pg_idem"
sed "s/^/  without pg_idem: /" "$OUT/run.bare" | grep -v ": idem_client_\|: #"

# pg_idem but not the administrator's table: exit 1 (an exception escaping
# main would abort, 134), with the CREATE TABLE to run.
admin -d "$ADMIN dbname=idem_quickstart_notable" -c "CREATE EXTENSION pg_idem" \
      -c "GRANT idem_client TO idem_quickstart_app"
rc=0
"$BIN" "$ADMIN dbname=idem_quickstart_notable user=idem_quickstart_app" >"$OUT/run.notable" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "without the table the quickstart exited $rc, expected 1"
grep -qx 'lease mode: 201 {"id": 1, "generation": [0-9]*}' "$OUT/run.notable" ||
    fail "without the table, lease mode did not answer 201"
grep -q 'quickstart_payments.*does not exist' "$OUT/run.notable" || fail "without the table: no database error"
grep -q '^  CREATE TABLE quickstart_payments' "$OUT/run.notable" || fail "without the table: no CREATE TABLE printed"
sed "s/^/  without the table: /" "$OUT/run.notable" | grep -v ": idem_client_\|: #"
echo "quickstart.sh: ok"
grep -hv '^idem_client\|^#' "$OUT/run.1" "$OUT/run.2"
