# Suite of tests/run.sh: PostgreSQL major-version upgrades with claims in
# flight (tests/upgrade/t), from Debian's 15 to the server under test:
# pg_upgrade, copy and --link.  Runs with make test PG=18 (or another
# newer major); with Debian's 15 under test there is nothing newer to
# upgrade to, and the suite says so.  Sourced; uses run_prove_suite
# (70_scaleout.sh), as_run_user, $WORK, $PG_MAJOR.
suite_major_upgrade() {
    if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ]; then
        skip_suite major_upgrade "needs a newer major than PostgreSQL $DEBIAN_PG_MAJOR under test (make test PG=18)"
        return
    fi
    local old=$WORK/old lib=/usr/lib/postgresql/$DEBIAN_PG_MAJOR share=/usr/share/postgresql/$DEBIAN_PG_MAJOR
    say "major upgrade: pg_idem for PostgreSQL $DEBIAN_PG_MAJOR, staged in $old"
    # The old side: Debian's 15 (a private copy, as the suites' own server)
    # with pg_idem built for it from a copy of the tree.
    mkdir -p "$old/usr/lib/postgresql" "$old/usr/share/postgresql"
    cp -a "$lib" "$old/usr/lib/postgresql/" && cp -a "$share" "$old/usr/share/postgresql/"
    rm -rf "$WORK/src-old" && cp -a "$WORK/src" "$WORK/src-old"
    [ "$(id -u)" = 0 ] && chown -R "$(run_user)": "$old" "$WORK/src-old"
    if ! as_run_user make -C "$WORK/src-old" -s PG_CONFIG="$lib/bin/pg_config" clean all \
            >"$WORK/major-upgrade-build.log" 2>&1 ||
       ! as_run_user make -C "$WORK/src-old" -s PG_CONFIG="$lib/bin/pg_config" DESTDIR="$old" install \
            >>"$WORK/major-upgrade-build.log" 2>&1; then
        tail -n 30 "$WORK/major-upgrade-build.log"
        count major_upgrade 0 1
        return
    fi
    run_prove_suite major_upgrade 'tests/upgrade/t/*.pl' IDEM_OLD_INSTALL="$old$lib"
}
