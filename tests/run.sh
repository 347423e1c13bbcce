#!/usr/bin/env bash
# make test: every suite against real servers, then one line "N passed, N failed".
#
# Installs what is missing, builds and installs the extension, starts a
# throwaway cluster (as an unprivileged user when run as root), and runs
# pg_regress, the isolation specs, the TAP tests, the C++ client tests and
# the driver examples.  A suite that fails does not stop the others.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"

PASSED=0
FAILED=0
FAILED_SUITES=()
SKIPPED_SUITES=()
SUITE_TIMES=()

count() {   # count SUITE PASSED FAILED
    PASSED=$((PASSED + $2))
    FAILED=$((FAILED + $3))
    [ "$3" -gt 0 ] && FAILED_SUITES+=("$1")
    printf '%s: %d passed, %d failed\n' "$1" "$2" "$3"
}

# A suite that cannot run against this server (PL/Proxy not built for
# it, ...): said in its line, counted as skipped, never as passed.
skip_suite() {   # skip_suite SUITE REASON
    SKIPPED_SUITES+=("$1 ($2)")
    printf '%s: skipped: %s\n' "$1" "$2"
}

# Every suite is a file tests/suites/NN_name.sh defining suite_name; they
# run in file-name order.  SUITES selects a subset while developing, e.g.
# make test SUITES="regress tap".
ALL_SUITES=()
for f in "$ROOT"/tests/suites/*.sh; do
    . "$f"
    n=$(basename "$f" .sh)
    ALL_SUITES+=("${n#*_}")
done

install_missing_packages bc
prepare_postgres || { echo "0 passed, 1 failed"; exit 1; }
make_workdir test
build_and_install_extension "$ROOT"
copy_tree "$ROOT"
# wal_level = logical: the docs' change-data-capture examples read the
# outbox through a logical replication slot (docs/guides/inbox-outbox.md).
start_cluster "shared_preload_libraries = 'pg_idem'
wal_level = logical" || { echo "0 passed, 1 failed"; exit 1; }
say "server: $(describe_postgres)"
as_run_user "$PG_BIN/psql" -X -At -c 'SELECT version()'

# SKIP_SUITES leaves suites out, said as skipped (.ci/run: what another
# major's run does already).
SUITES=" ${SUITES:-${ALL_SUITES[*]}} "
for s in "${ALL_SUITES[@]}"; do
    if [[ " ${SKIP_SUITES:-} " == *" $s "* && $SUITES == *" $s "* ]]; then
        skip_suite "$s" "SKIP_SUITES: ${SKIP_REASON:-left out of this run}"
    elif [[ $SUITES == *" $s "* ]]; then
        suite_started=$SECONDS
        "suite_$s"
        SUITE_TIMES+=("$s $((SECONDS - suite_started)) s")
    fi
done

stop_cluster
echo
echo "server: $(describe_postgres)"
echo "time per suite: $(IFS=,; echo "${SUITE_TIMES[*]}" | sed 's/,/, /g'); $SECONDS s in all"
[ ${#SKIPPED_SUITES[@]} -gt 0 ] && printf 'skipped suite: %s\n' "${SKIPPED_SUITES[@]}"
[ ${#FAILED_SUITES[@]} -gt 0 ] && echo "failed suites: ${FAILED_SUITES[*]}"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
