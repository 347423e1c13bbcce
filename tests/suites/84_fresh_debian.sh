# Suite of tests/run.sh: the docs' install lines, as written, on a fresh
# Debian 12 (tests/fresh_debian/run.sh: debootstrap's minimal bookworm,
# cached; every <!-- install: --> block of README.md and client/*/README.md
# as a user with sudo; then the extension created on a server that user
# starts, a claim, and a request through each client).  Sourced; uses
# count, skip_suite, say, install_missing_packages, $WORK, $ROOT.
#
# It does not depend on the server under test: a run that follows one on
# another major (.ci/run, PG_IDEM_MAJOR_INDEPENDENT_DONE) leaves it out.
# Root only (debootstrap, chroot, mounts).  Time on the 2-core machine:
# see docs/design.md's suite table.
suite_fresh_debian() {
    if [ "${PG_IDEM_MAJOR_INDEPENDENT_DONE:-0}" = 1 ]; then
        skip_suite fresh_debian "does not depend on the server's major; run in this CI's first run"
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        skip_suite fresh_debian "needs root (debootstrap, chroot, mounts)"
        return
    fi
    say "the docs' install blocks on a fresh Debian 12 (debootstrap, cached in $PG_IDEM_CACHE/fresh-debian)"
    install_missing_packages debootstrap zstd
    local line log=$WORK/fresh-debian.log started=$SECONDS
    PG_IDEM_CACHE=$PG_IDEM_CACHE bash "$ROOT/tests/fresh_debian/run.sh" "$WORK/src" "$WORK/fresh-debian" >"$log" 2>&1
    while IFS= read -r line; do
        echo "$line"
        case $line in
            "ok "*) count "fresh_debian: ${line#ok }" 1 0 ;;
            "not ok "*) count "fresh_debian: ${line#not ok }" 0 1 ;;
        esac
    done <"$log"
    grep -qE '^ok .*C\+\+: ' "$log" || grep -q '^not ok ' "$log" || count "fresh_debian: ran to its end" 0 1
    echo "fresh_debian: $((SECONDS - started)) s"
}
