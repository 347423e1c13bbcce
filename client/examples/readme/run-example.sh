#!/usr/bin/env bash
# The README's Getting started, run exactly as written (used by make test):
# the block after <!-- getting-started:admin --> as a superuser in a fresh
# database, the block after <!-- getting-started:app --> with psql as the
# role it creates, and every "\echo" line must print what the "--  " comment
# under it says ("…" matches anything; a line "--  text" is an expected
# output, so other comments in the block start with "-- " and one space).  So the walkthrough cannot drift.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
readme=$here/../../../README.md
db=idem_example_readme
work=$(mktemp -d "${TMPDIR:-/tmp}/pg_idem.readme.XXXXXX")
admin() { PGOPTIONS=--client-min-messages=warning psql -X -q -v ON_ERROR_STOP=1 "$@"; }
cleanup() {
    admin -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
        -c "DROP ROLE IF EXISTS my_service_role" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
cleanup
mkdir -p "$work"

# block MARKER: the fenced block that follows the marker line.
block() {
    awk -v m="<!-- getting-started:$1" '
        index($0, m) == 1 { found = 1; next }
        found && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }' "$readme"
}
block admin >"$work/admin.sql"
block app >"$work/app.sql"
[ -s "$work/admin.sql" ] && [ -s "$work/app.sql" ] || { echo "README: a getting-started block is missing"; exit 1; }

admin -d postgres -c "CREATE DATABASE $db" >/dev/null
admin -d "$db" -f "$work/admin.sql" >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -U my_service_role -f "$work/app.sql" >"$work/out" 2>&1 ||
    { cat "$work/out"; echo "readme example: the Getting started block failed"; exit 1; }
# The role really is unprivileged.
[ "$(psql -X -At -d "$db" -U my_service_role -c "SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles WHERE rolname = current_user")" = f ]

cat >"$work/compare.py" <<'PY'
import re, sys
sql, out = (open(f).read().splitlines() for f in sys.argv[1:])
expected = [l[4:] for l in sql if l.startswith("--  ")]
echoed = [l for l in out if l.strip()]
ok = len(expected) == len(echoed) and all(
    re.fullmatch(".*".join(map(re.escape, e.split("…"))), g) for e, g in zip(expected, echoed))
from itertools import zip_longest
for e, g in zip_longest(expected, echoed, fillvalue=""):
    print(f"  README: {e!r:50} psql: {g!r}")
print("readme example:", "ok" if ok else "FAILED (the README and psql disagree)")
sys.exit(0 if ok else 1)
PY
# The comparison can fail: a README that promised another outcome must not pass.
sed 's/^--  retry: replay/--  retry: claimed/' "$work/app.sql" >"$work/wrong.sql"
if /usr/bin/python3 "$work/compare.py" "$work/wrong.sql" "$work/out" >/dev/null; then
    echo "readme example: a wrong expectation was not noticed"
    exit 1
fi
/usr/bin/python3 "$work/compare.py" "$work/app.sql" "$work/out"
