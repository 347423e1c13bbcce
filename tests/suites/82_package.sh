# Suite of tests/run.sh: the packages users install.  Sourced; uses count,
# say, as_run_user, run_user, free_port, stage_postgres, $WORK, $PG_BIN.
#
# - META.json is a valid PGXN description whose versions are the control
#   file's (tests/package/meta_check.py);
# - debian/ builds with dpkg-buildpackage and pg_buildext, one
#   postgresql-NN-pg-idem per PostgreSQL major installed from Debian; each
#   package, unpacked into a private copy of its server's installation,
#   creates the extension on a new cluster and answers a claim and its
#   replay;
# - a PGXN zip of the tree installs with pgxnclient (`pgxn install`) into
#   another private copy, and works the same way.
#
# Nothing is installed into the system's PostgreSQL: dpkg -x and pgxn's
# --pg_config write into the copies.

# A cluster of the installation whose bin/ is $1 in $2: create the
# extension, claim a key and replay it.  Prints what went wrong.
package_smoke() {   # BIN DIR
    local bin=$1 dir=$2 port out
    port=$(free_port)
    as_run_user "$bin/initdb" -D "$dir/data" -A trust -U "$(run_user)" -E UTF8 --locale=C.UTF-8 \
        >"$dir/initdb.log" 2>&1 || { tail -n 20 "$dir/initdb.log"; return 1; }
    printf "listen_addresses = ''\nunix_socket_directories = '%s'\nport = %s\nshared_preload_libraries = 'pg_idem'\nfsync = off\n" \
        "$dir" "$port" | as_run_user tee -a "$dir/data/postgresql.conf" >/dev/null
    as_run_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null ||
        { tail -n 20 "$dir/server.log"; return 1; }
    out=$(as_run_user "$bin/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -d postgres -c "
        CREATE EXTENSION pg_idem;
        SELECT extversion FROM pg_extension WHERE extname = 'pg_idem';
        SELECT outcome FROM idem_claim(idem_key('p', 'POST', '/pay', 'k1'), idem_request_hash('b'));
        SELECT idem_finalize(idem_key('p', 'POST', '/pay', 'k1'), claim_id, 201, '{}', 'paid')
          FROM idem_keys WHERE state = 'pending';
        SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
          FROM idem_claim(idem_key('p', 'POST', '/pay', 'k1'), idem_request_hash('b'));" 2>&1)
    as_run_user "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1
    local want
    want=$(printf '%s\nclaimed\nt\nreplay paid' "$PACKAGE_VERSION")
    [ "$out" = "$want" ] || { echo "got: $out"; echo "want: $want"; return 1; }
}

suite_package() {
    local pk=$WORK/package src log v deb stage ok
    # pg_buildext builds for the majors installed from Debian (15 here),
    # which make test without PG covers; a cached build is no Debian package.
    if [ -n "$PG_PREFIX" ]; then
        skip_suite package "Debian packages are built for Debian's installed PostgreSQL $DEBIAN_PG_MAJOR: run make test"
        return
    fi
    say "packages: META.json for PGXN, Debian packages with pg_buildext, pgxn install"
    install_missing_packages debhelper postgresql-server-dev-all pgxnclient dpkg-dev fakeroot
    PACKAGE_VERSION=$(sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" "$WORK/src/extension/pg_idem.control")

    if (cd "$WORK/src" && python3 tests/package/meta_check.py META.json extension/pg_idem.control); then
        count "package: META.json" 1 0
    else
        count "package: META.json" 0 1
    fi
    if grep -q "^pg-idem ($PACKAGE_VERSION)" "$WORK/src/debian/changelog"; then
        count "package: debian/changelog names $PACKAGE_VERSION" 1 0
    else
        head -n 1 "$WORK/src/debian/changelog"
        count "package: debian/changelog names $PACKAGE_VERSION" 0 1
    fi

    # Debian: build from a clean copy of the tree, as dpkg-buildpackage wants.
    mkdir -p "$pk/src"
    (cd "$WORK/src" && tar --exclude=./results --exclude=./output_iso --exclude=./tmp_check \
        --exclude='./*.so' --exclude='./*.o' -cf - .) | tar -xf - -C "$pk/src"
    make -C "$pk/src" -s clean PG_CONFIG="$SYSTEM_PG_BIN/pg_config" >/dev/null 2>&1
    log=$pk/dpkg-buildpackage.log
    if (cd "$pk/src" && pg_buildext updatecontrol >"$log" 2>&1 &&
        DEB_BUILD_OPTIONS="nocheck parallel=2" dpkg-buildpackage -us -uc -b >>"$log" 2>&1); then
        count "package: dpkg-buildpackage" 1 0
    else
        tail -n 40 "$log"
        count "package: dpkg-buildpackage" 0 1
        return
    fi
    for v in $(pg_buildext supported-versions "$pk/src"); do
        deb=$(ls "$pk"/postgresql-"$v"-pg-idem_"$PACKAGE_VERSION"_*.deb 2>/dev/null | head -n 1)
        if [ -z "$deb" ]; then
            count "package: postgresql-$v-pg-idem built" 0 1
            continue
        fi
        count "package: postgresql-$v-pg-idem built" 1 0
        stage=$pk/deb-$v
        mkdir -p "$stage"
        PG_MAJOR=$v stage_postgres "$stage/root"
        dpkg -x "$deb" "$stage/root"
        # Not recursive: the copy's files are hard links to the system's.
        chmod 755 "$pk" "$stage"
        [ "$(id -u)" = 0 ] && chown "$(run_user)": "$stage"
        if package_smoke "$stage/root/usr/lib/postgresql/$v/bin" "$stage"; then
            count "package: postgresql-$v-pg-idem creates the extension and answers a claim" 1 0
        else
            count "package: postgresql-$v-pg-idem creates the extension and answers a claim" 0 1
        fi
    done

    # PGXN: the distribution zip pgxn would download, installed by pgxnclient.
    stage=$pk/pgxn
    mkdir -p "$stage"
    stage_postgres "$stage/root"
    mkdir -p "$stage/root/usr/lib/x86_64-linux-gnu"    # pg_config's libdir must exist
    (cd "$pk/src" && make -s clean PG_CONFIG="$SYSTEM_PG_BIN/pg_config" >/dev/null 2>&1
     python3 - "$PACKAGE_VERSION" "$stage/pg_idem-$PACKAGE_VERSION.zip" <<'PY'
import os, sys, zipfile
version, out = sys.argv[1:3]
with zipfile.ZipFile(out, "w") as z:
    for d, dirs, files in os.walk("."):
        dirs[:] = [x for x in dirs if x not in (".git", "debian", "node_modules")]
        for f in files:
            z.write(os.path.join(d, f), os.path.join("pg_idem-" + version, d, f))
PY
    )
    log=$stage/pgxn.log
    if (cd "$stage" && pgxn install --yes --make make --nosudo \
            --pg_config "$stage/root/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" \
            "./pg_idem-$PACKAGE_VERSION.zip" >"$log" 2>&1); then
        count "package: pgxn install" 1 0
        chmod 755 "$stage"
        [ "$(id -u)" = 0 ] && chown "$(run_user)": "$stage"
        if package_smoke "$stage/root/usr/lib/postgresql/$PG_MAJOR/bin" "$stage"; then
            count "package: the pgxn install creates the extension and answers a claim" 1 0
        else
            count "package: the pgxn install creates the extension and answers a claim" 0 1
        fi
    else
        tail -n 30 "$log"
        count "package: pgxn install" 0 1
    fi
}
