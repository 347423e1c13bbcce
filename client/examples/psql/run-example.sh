#!/usr/bin/env bash
# Run the psql example as the application role in a database of its own
# (used by make test), then once with a wrong expectation: it must fail.
set -euo pipefail
db=idem_example_psql
role=idem_example_psql_app
here=$(cd "$(dirname "$0")" && pwd)
admin() { PGOPTIONS=--client-min-messages=warning psql -X -q -v ON_ERROR_STOP=1 "$@" >/dev/null; }
cleanup() {
    admin -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP ROLE IF EXISTS $role" || true
}
trap cleanup EXIT
cleanup
admin -d postgres -c "CREATE DATABASE $db" -c "CREATE ROLE $role LOGIN"
# The owner's one-time step the example's comment shows.
admin -d "$db" -c "CREATE EXTENSION pg_idem" -c "GRANT idem_client TO $role" \
    -c "CREATE TABLE example_payments (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)" \
    -c "GRANT SELECT, INSERT ON example_payments TO $role" \
    -c "GRANT USAGE ON SEQUENCE example_payments_id_seq TO $role"

psql -X -q -d "$db" -U "$role" -v ON_ERROR_STOP=1 -f "$here/payments.sql"

echo "-- the same example with a wrong expectation (2 payment rows): it must exit non-zero"
if psql -X -q -d "$db" -U "$role" -v ON_ERROR_STOP=1 -v expected_rows=2 -f "$here/payments.sql"; then
    echo "psql example: exited 0 although a result was wrong"
    exit 1
fi
echo "psql example: a wrong result makes it exit non-zero, as it should"
