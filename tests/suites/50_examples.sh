# Suite of tests/run.sh: the driver examples (client/examples/*/run-example.sh).  Sourced; uses count, say, as_run_user, $WORK, $PG_BIN.
# Examples in other languages: each script exits non-zero on failure.
suite_examples() {
    local script
    for script in "$WORK"/src/client/examples/*/run-example.sh; do
        [ -f "$script" ] || continue
        say "example $(basename "$(dirname "$script")")"
        if as_run_user bash "$script"; then
            count "example $(basename "$(dirname "$script")")" 1 0
        else
            count "example $(basename "$(dirname "$script")")" 0 1
        fi
    done
}

