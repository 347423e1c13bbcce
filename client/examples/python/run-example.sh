#!/usr/bin/env bash
# Run the Python example in a database of its own (used by make test).
set -euo pipefail
db=idem_example_python
dropdb --if-exists "$db" 2>/dev/null || true
createdb "$db"
psql -X -q -d "$db" -c "CREATE EXTENSION pg_idem"
# Debian's python3, where python3-psycopg is installed.
PGDATABASE=$db /usr/bin/python3 "$(dirname "$0")/payments.py"
dropdb "$db"
