# Suite of tests/run.sh: static checks.  Sourced; uses count, say,
# as_run_user, $WORK, $PG_BIN.
#
# - the house rules (tests/static/house.py): the generated protocol files
#   are up to date, no source file is over 800 lines, header guards name
#   their folder and file, no circle of includes or calls between files or
#   folders (core/ depends on no other), no function over 150 lines, every
#   repository path a file names exists, docs/design.md's maps match the
#   tree, every code block of every Markdown file says how it runs, and the
#   library exports only idem_* symbols;
# - the extension builds with gcc -Wall -Wextra -Werror.  Two -Wextra
#   warnings are off: -Wunused-parameter (PostgreSQL's own headers trip it,
#   57 times, and our callbacks have the signatures PostgreSQL's hooks
#   impose), -Wmissing-field-initializers (our statement tables give the
#   SQL and its argument types and leave the cached plan to C's
#   zero-initialisation on purpose);
# - clang's static analyzer (scan-build, Debian clang-tools) reports
#   nothing in extension/ (built with PGXS through scan-build's compiler
#   wrapper) nor in client/cpp (built with cmake the same way).
#
# make test analyses the C++ library; SUITES=static also its tests, bench
# and examples (a few minutes more).

STATIC_ASKED=0
[[ " ${SUITES:-} " == *" static "* ]] && STATIC_ASKED=1

# Analyzer reports in a scan-build log: "file:line:col: warning: ... [checker]".
static_reports() {
    grep -E ': warning: .*\[(core|deadcode|unix|cplusplus|security|optin|nullability|alpha|valist|apiModeling)\.' "$1" |
        sort -u
}

suite_static() {
    local st=$WORK/static log ours n started=$(date +%s)
    say "static checks: house rules, gcc -Wall -Wextra -Werror, scan-build"
    local line
    while IFS= read -r line; do
        echo "$line"
        case $line in
            "ok "*) count "static: ${line#ok }" 1 0 ;;
            "not ok "*) local name=${line#not ok }; count "static: ${name%%:*}" 0 1 ;;
        esac
    done < <(cd "$WORK/src" && python3 tests/static/house.py --so "$PG_BIN/../lib/pg_idem.so" 2>&1)
    if ! command -v scan-build >/dev/null; then
        count "static: scan-build" 0 1
        return
    fi
    as_run_user mkdir -p "$st"
    (cd "$WORK/src" && tar --exclude=./results --exclude=./output_iso --exclude=./tmp_check \
        -cf - Makefile extension client/cpp) | as_run_user tar -xf - -C "$st"
    as_run_user make -C "$st" -s PG_CONFIG="$PG_BIN/pg_config" clean >/dev/null 2>&1

    log=$st/wextra.log
    if as_run_user make -C "$st" -s PG_CONFIG="$PG_BIN/pg_config" with_llvm=no \
            COPT="-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror" \
            >"$log" 2>&1; then
        count "static: extension -Wall -Wextra -Werror" 1 0
    else
        grep -E 'warning|error' "$log" | head -n 40
        count "static: extension -Wall -Wextra -Werror" 0 1
    fi
    as_run_user make -C "$st" -s PG_CONFIG="$PG_BIN/pg_config" clean >/dev/null 2>&1

    # scan-build puts its compiler wrapper in $CC; PGXS sets CC itself, so
    # it is passed on make's command line.
    log=$st/scan-extension.log
    as_run_user scan-build -o "$st/scan-extension" sh -c \
        'make -C "$0" -s PG_CONFIG="$1" with_llvm=no CC="$CC"' "$st" "$PG_BIN/pg_config" >"$log" 2>&1 ||
        { tail -n 30 "$log"; count "static: scan-build extension (build)" 0 1; }
    ours=$(static_reports "$log" | grep -cE '(^|/)extension/')
    n=$(static_reports "$log" | wc -l)
    echo "scan-build extension: $ours reports in extension/, $n in all"
    static_reports "$log"
    count "static: scan-build extension" $((ours == 0)) "$ours"

    # The C++ client does not depend on the server's major: a run that
    # follows one on another major of the same tree (.ci/run) leaves it.
    if [ "${PG_IDEM_MAJOR_INDEPENDENT_DONE:-0}" = 1 ]; then
        skip_suite "static: scan-build client/cpp" "does not depend on the server's major; analysed in this CI's first run"
        echo "static: $(($(date +%s) - started)) s"
        return
    fi
    local opts=(-DPG_IDEM_BUILD_TESTS=OFF -DPG_IDEM_BUILD_BENCH=OFF -DPG_IDEM_BUILD_EXAMPLES=OFF)
    [ "$STATIC_ASKED" = 1 ] && opts=()
    log=$st/scan-client.log
    if as_run_user scan-build -o "$st/scan-client" cmake -S "$st/client/cpp" -B "$st/client-build" \
            -DCMAKE_BUILD_TYPE=Debug "${opts[@]}" >"$log" 2>&1 &&
       as_run_user scan-build -o "$st/scan-client" cmake --build "$st/client-build" -j2 >>"$log" 2>&1; then
        ours=$(static_reports "$log" | grep -cE '/client/cpp/')
        n=$(static_reports "$log" | wc -l)
        echo "scan-build client/cpp (${opts[*]:-everything}): $ours reports in client/cpp/, $n in all"
        static_reports "$log"
        count "static: scan-build client/cpp" $((ours == 0)) "$ours"
    else
        tail -n 30 "$log"
        count "static: scan-build client/cpp (build)" 0 1
    fi
    echo "static: $(($(date +%s) - started)) s"
}
