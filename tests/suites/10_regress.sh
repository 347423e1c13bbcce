# Suite of tests/run.sh: pg_regress (sql/, expected/).  Sourced; uses count, say, as_run_user, $WORK, $PG_BIN.
# pg_regress and pg_isolation_regress print "test name ... ok" per test.
run_pg_regress_suite() {   # NAME MAKE-ARGS...
    local name=$1 log="$WORK/$1.log" ok bad
    shift
    say "$name"
    as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck "$@" \
        >"$log" 2>&1
    local rc=$?
    cat "$log"
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$log")
    bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]|failed \(ignored\)' "$log")
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    if [ "$bad" -gt 0 ]; then
        for diffs in "$WORK/src/regression.diffs" "$WORK/src/output_iso/regression.diffs"; do
            [ -f "$diffs" ] && head -c 20000 "$diffs"
        done
    fi
    count "$name" "$ok" "$bad"
}

suite_regress() { run_pg_regress_suite "pg_regress" ISOLATION= TAP_TESTS=; }
