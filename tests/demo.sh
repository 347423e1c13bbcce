#!/usr/bin/env bash
# make demo: pg_idem stopping duplicate work, on a throwaway cluster.
#
# With the HTTP example (client/cpp/examples/demo/storm.sh) present, the demo builds
# the C++ client and idem-demo-server, starts the service as the postgres
# user and runs the duplicate-request storm against it, printing a table
# (the storm script stops the service on exit, the trap below the cluster);
# otherwise it walks through the SQL protocol: two concurrent claims of one
# key, a replay, a mismatch and the steal of an abandoned claim.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"

install_missing_packages
make_workdir demo
build_and_install_extension "$ROOT"
start_cluster "shared_preload_libraries = 'pg_idem'"

if [ -f "$ROOT/client/cpp/examples/demo/storm.sh" ]; then
    bash "$ROOT/client/cpp/examples/demo/storm.sh"
    exit $?
fi

psql_q() { as_run_user psql -X -q -A -t -v ON_ERROR_STOP=1 "$@"; }
psql_q -c "CREATE EXTENSION pg_idem"

KEY="idem_key('alice', 'POST', '/payments', 'order-42')"
BODY="idem_request_hash(convert_to('{\"amount\": 100}', 'UTF8'))"
OTHER="idem_request_hash(convert_to('{\"amount\": 999}', 'UTF8'))"
FAILURES=0
row() {   # row STEP EXPECTED ACTUAL
    local mark=ok
    [ "$2" = "$3" ] || { mark=UNEXPECTED; FAILURES=$((FAILURES + 1)); }
    printf '%-58s %-22s %-22s %s\n' "$1" "$2" "$3" "$mark"
}

echo
printf '%-58s %-22s %-22s %s\n' "step" "expected" "got" ""
printf '%-58s %-22s %-22s %s\n' "----" "--------" "---" ""

# 1. Two requests with one key at the same moment: both wait on a gate,
# then claim together.
psql_q -c "SELECT pg_advisory_lock(42)" -c "SELECT pg_sleep(1.5)" >/dev/null &
sleep 0.3
for i in 1 2; do
    psql_q -c "SELECT pg_advisory_lock_shared(42)" \
        -c "SELECT outcome FROM idem_claim($KEY, $BODY, '2 seconds')" \
        >"$WORK/claim$i.out" 2>&1 &
done
wait
outcomes=$(grep -hv '^$' "$WORK"/claim?.out | sort | paste -sd' ')
row "two concurrent claims of one key" "claimed in_progress" "$outcomes"

# 2. The winner stores its response; a retry replays it.
psql_q -c "SELECT idem_finalize($KEY, claim_id, 201, '{\"content-type\": \"application/json\"}',
                                convert_to('{\"payment\": 7}', 'UTF8'))
             FROM idem_keys WHERE cache_key = $KEY" >/dev/null
got=$(psql_q -c "SELECT outcome || ' ' || response_status FROM idem_claim($KEY, $BODY)")
row "retry after the winner finished" "replay 201" "$got"
got=$(psql_q -c "SELECT convert_from(response_body, 'UTF8') FROM idem_claim($KEY, $BODY)")
row "replayed body" '{"payment": 7}' "$got"

# 3. The same key with another body is refused.
got=$(psql_q -c "SELECT outcome FROM idem_claim($KEY, $OTHER)")
row "same key, another body" "mismatch" "$got"

# 4. A winner that dies: its lease expires and the next request takes over.
KEY2="idem_key('alice', 'POST', '/payments', 'order-43')"
psql_q -F ' ' -c "SELECT claim_id, generation FROM idem_claim($KEY2, $BODY, '200 milliseconds')" \
    | { read -r DEAD_CLAIM DEAD_GENERATION; echo "$DEAD_CLAIM" >"$WORK/dead.out"; echo "$DEAD_GENERATION" >"$WORK/dead.gen"; }
got=$(psql_q -c "SELECT outcome FROM idem_claim($KEY2, $BODY)")
row "retry while the first owner's lease is live" "in_progress" "$got"
sleep 0.3
got=$(psql_q -c "SELECT outcome FROM idem_claim($KEY2, $BODY)")
row "retry after the lease expired" "recovered_abandoned" "$got"
got=$(psql_q -c "SELECT idem_finalize($KEY2, '$(cat "$WORK/dead.out")', 200, NULL, NULL)")
row "late finalize by the first owner (fenced)" "f" "$got"
got=$(psql_q -c "SELECT generation > $(cat "$WORK/dead.gen") FROM idem_keys WHERE cache_key = $KEY2")
row "generation went up with the steal (fencing)" "t" "$got"

echo
psql_q -c "SELECT counter || ': ' || value FROM idem_stats WHERE value > 0"
echo
if [ "$FAILURES" -gt 0 ]; then
    echo "demo: $FAILURES unexpected results"
    exit 1
fi
echo "demo: every step behaved as expected"
