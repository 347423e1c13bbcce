# Suite of tests/run.sh: the TAP tests (tests/t).  Sourced; uses count, say, as_run_user, $WORK, $PG_BIN.
# prove prints "Files=N, Tests=M" and "Failed X/Y subtests" on failure.
suite_tap() {
    local log="$WORK/tap.log" tests bad
    say "TAP"
    as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck \
        REGRESS= ISOLATION= PROVE_FLAGS=-v >"$log" 2>&1
    local rc=$?
    grep -vE '^# ' "$log" | tail -n 60
    tests=$(grep -oE 'Tests=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    bad=$(grep -oE '^Failed [0-9]+/' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc 2>/dev/null)
    tests=${tests:-0}
    bad=${bad:-0}
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
        bad=1
        tail -n 100 "$WORK"/src/tmp_check/log/*.log 2>/dev/null | tail -n 200
    fi
    count TAP $((tests - bad > 0 ? tests - bad : 0)) "$bad"
}

