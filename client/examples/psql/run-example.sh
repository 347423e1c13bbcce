#!/usr/bin/env bash
# Run the psql example in a database of its own (used by make test).
set -euo pipefail
db=idem_example_psql
dropdb --if-exists "$db" 2>/dev/null || true
createdb "$db"
psql -X -q -d "$db" -c "CREATE EXTENSION pg_idem"
psql -X -q -d "$db" -v ON_ERROR_STOP=1 -f "$(dirname "$0")/payments.sql"
dropdb "$db"
