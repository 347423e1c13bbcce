# Suite of tests/run.sh: the driver examples (client/examples/*/run-example.sh)
# and every fenced example of every Markdown file (tests/docs/run_examples.py).
# Sourced; uses count, say, as_run_user, client_build, $WORK, $PG_BIN.
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

    # The docs' runner must be able to fail before its passes mean anything.
    local runner="$WORK/src/tests/docs/run_examples.py" log="$WORK/docs-examples.log" ok bad
    say "docs examples: the runner's self-test (every kind of block can fail)"
    if (cd "$WORK/src" && as_run_user /usr/bin/python3 "$runner" --self-test) >"$log" 2>&1; then
        tail -n 1 "$log"
        count "docs examples self-test" 1 0
    else
        cat "$log"
        count "docs examples self-test" 0 1
    fi
    # The C++ README's CMake lines build against the client the client suite
    # built (it runs first): installed here, never built again.  Without
    # that build the runner says the cmake blocks were not run, and why.
    local cpp_prefix=
    if [ -e "$(client_build)/libpg_idem.so" ] && [ -e "$(client_build)/libpg_idem.a" ]; then
        cpp_prefix=$WORK/docs-cpp-prefix
        as_run_user cmake --install "$(client_build)" --prefix "$cpp_prefix" >"$WORK/docs-cpp-install.log" 2>&1 ||
            { tail -n 20 "$WORK/docs-cpp-install.log"; cpp_prefix=; }
    fi
    say "docs examples: every fenced block of every Markdown file, every relative link"
    (cd "$WORK/src" && as_run_user env IDEM_DOCS_CPP_PREFIX="$cpp_prefix" /usr/bin/python3 "$runner") >"$log" 2>&1
    local rc=$?
    grep -vE '^ok ' "$log"
    ok=$(grep -oE '^docs examples: [0-9]+ passed' "$log" | grep -oE '[0-9]+')
    bad=$(grep -oE '^docs examples: [0-9]+ passed, [0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    ok=${ok:-0} bad=${bad:-0}
    [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    count "docs examples" "$ok" "$bad"
}
