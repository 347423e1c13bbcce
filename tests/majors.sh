# Sourced by tests/lib.sh: a PostgreSQL other than Debian's 15 for
# make test PG=N (and CASSERT=1), built once and cached.
#
# Debian 12 ships PostgreSQL 15 only.  For another major we take Debian's
# own packages through a private apt configuration (never the machine's
# sources, which stay untouched):
#   - from source, when the archive serves the source package
#     (apt-get source postgresql-N; sid serves 18): configure, build the
#     server, the contrib modules the suites use, pg_regress,
#     isolationtester and the TAP modules, install into the cache;
#   - from the binary packages otherwise (trixie's 17, experimental's 19,
#     whose sources answer 404): dpkg -x of the server, client and
#     server-dev packages into the cache.  A binary build cannot be
#     assert-enabled, and Debian does not package isolationtester, so the
#     isolation suite is skipped there.
#
# The cache: $PG_IDEM_CACHE, by default /var/cache/pg_idem for root and
# ~/.cache/pg_idem for other users; one directory per version and flags
# (postgresql-18.6, postgresql-18.6-cassert, postgresql-17.12-deb, ...).
# A directory is used only once its build finished (the .complete file);
# remove it to rebuild.

PG_IDEM_CACHE=${PG_IDEM_CACHE:-$(if [ "$(id -u)" = 0 ]; then echo /var/cache/pg_idem; else echo "${XDG_CACHE_HOME:-$HOME/.cache}/pg_idem"; fi)}

# The contrib modules the suites load (amcheck, dblink, auto_explain and the
# usual maintenance and decoding tools a test may reach for).
MAJOR_CONTRIB="amcheck dblink auto_explain pageinspect test_decoding pg_stat_statements
pg_visibility pgstattuple pg_walinspect pg_buffercache postgres_fdw pg_prewarm"

# Packages a source build needs on top of IDEM_PACKAGES.
MAJOR_BUILD_PACKAGES="bison flex libreadline-dev zlib1g-dev libssl-dev libicu-dev
dpkg-dev xz-utils bzip2"

# apt-get with the private configuration in $PG_IDEM_CACHE/apt: Debian's
# archive (the mirror the machine uses) for sid, trixie, experimental and
# bookworm (whose source of 15 makes the assert-enabled 15).
major_apt() {
    local a=$PG_IDEM_CACHE/apt mirror
    if [ ! -f "$a/sources.list" ]; then
        mirror=$(grep -rhE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
            grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ')
        mirror=${mirror:-http://deb.debian.org/debian}
        mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
        local k=/usr/share/keyrings/debian-archive-keyring.gpg s
        for s in sid trixie experimental bookworm; do
            echo "deb-src [signed-by=$k] $mirror $s main"
            echo "deb [signed-by=$k] $mirror $s main"
        done >"$a/sources.list"
    fi
    apt-get -q -o Dir::Etc::sourcelist="$a/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$a/lists" -o Dir::Cache="$a/cache" \
        -o APT::Get::List-Cleanup=0 -o Debug::NoDropPrivs=1 "$@"
}
major_apt_cache() {
    local a=$PG_IDEM_CACHE/apt
    apt-cache -o Dir::Etc::sourcelist="$a/sources.list" -o Dir::Etc::sourceparts=- \
        -o Dir::State::Lists="$a/lists" -o Dir::Cache="$a/cache" "$@"
}

# Refresh the private indexes at most once a day.
major_apt_update() {
    local stamp=$PG_IDEM_CACHE/apt/updated
    major_apt --version >/dev/null   # writes sources.list
    [ -n "$(find "$stamp" -mmin -1440 2>/dev/null)" ] && return 0
    major_apt update >"$PG_IDEM_CACHE/apt/update.log" 2>&1 && touch "$stamp"
}

# Sets PG_PREFIX (the installation), PG_VERSION_FULL and PG_FROM (source or
# deb) for major $1, building it when it is not cached; $2 = 1 for an
# assert-enabled build.
ensure_major() {
    local major=$1 cassert=${2:-0} version flavour dir rc
    mkdir -p "$PG_IDEM_CACHE"
    # One build at a time per cache (another make test may be building the
    # same version); the lock is released when this function returns.
    exec {major_lock}>"$PG_IDEM_CACHE/.lock"
    flock "$major_lock"
    ensure_major_locked "$major" "$cassert"
    rc=$?
    exec {major_lock}>&-
    return $rc
}

ensure_major_locked() {
    local major=$1 cassert=${2:-0} version flavour dir
    major_apt_update || { echo "cannot update the private apt indexes (see $PG_IDEM_CACHE/apt/update.log)" >&2; return 1; }
    version=$(major_apt_cache showsrc "postgresql-$major" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)
    if [ -n "$version" ] && major_source_available "$major" "$version"; then
        PG_FROM=source
        flavour=${version%-*}
        [ "$cassert" = 1 ] && flavour+=-cassert
        dir=$PG_IDEM_CACHE/postgresql-$flavour
        [ -f "$dir/.complete" ] || build_major_from_source "$major" "$version" "$cassert" "$dir" || return 1
    else
        [ "$cassert" = 1 ] && { echo "PostgreSQL $major: no source package to build with --enable-cassert" >&2; return 1; }
        version=$(major_apt_cache show "postgresql-$major" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)
        [ -n "$version" ] || { echo "PostgreSQL $major: neither a source nor a binary package in Debian's archive" >&2; return 1; }
        PG_FROM=deb
        dir=$PG_IDEM_CACHE/postgresql-${version%-*}-deb
        [ -f "$dir/.complete" ] || unpack_major_debs "$major" "$dir" || return 1
    fi
    PG_PREFIX=$(cat "$dir/.complete")
    if [ "$PG_FROM" = deb ]; then
        PG_CONFIG_SHIM=$dir/pg_config
        PG_VERSION_FULL=$("$PG_CONFIG_SHIM" --version | sed 's/^PostgreSQL //')
    else
        PG_VERSION_FULL=$("$PG_PREFIX/bin/postgres" --version | sed 's/^postgres (PostgreSQL) //')
    fi
    export PG_PREFIX PG_VERSION_FULL PG_FROM
}

# Whether the archive really serves the source (17's and 19's answer 404).
major_source_available() {
    local src=$PG_IDEM_CACHE/sources/$1-$2
    [ -f "$src/.fetched" ] && return 0
    mkdir -p "$src"
    (cd "$src" && major_apt source --download-only "postgresql-$1=$2" >fetch.log 2>&1) &&
        touch "$src/.fetched"
}

# The newest upstream tarball of Debian source package $1 the archive
# serves, checked against the SHA-256 of the Sources index, into $2;
# prints its path.  (For PL/Proxy the archive serves the .orig.tar.gz of
# trixie's 2.11.0 while its .dsc and sid's files answer 404, so apt-get
# source cannot be used.)
fetch_orig_tarball() {   # PACKAGE DIR
    local pkg=$1 dir=$2 mirror line sum file directory
    mirror=$(awk '/^deb-src/ {print $3; exit}' "$PG_IDEM_CACHE/apt/sources.list")
    mkdir -p "$dir"
    while read -r directory sum file; do
        [ -f "$dir/$file" ] && echo "$sum  $dir/$file" | sha256sum -c --status && { echo "$dir/$file"; return 0; }
        curl -fsS -o "$dir/$file.part" "$mirror/$directory/$file" 2>/dev/null || continue
        if echo "$sum  $dir/$file.part" | sha256sum -c --status; then
            mv "$dir/$file.part" "$dir/$file"
            echo "$dir/$file"
            return 0
        fi
        rm -f "$dir/$file.part"
    done < <(major_apt_cache showsrc "$pkg" 2>/dev/null | awk '
        /^Version:/ {v=$2} /^Directory:/ {d=$2}
        /^Checksums-Sha256:/ {c=1; next}
        c && /^ / { if ($3 ~ /orig\.tar/) f[v]=$1 " " $3; next } {c=0}
        /^$/ { if (v in f) print v, d, f[v]; v=""; }
        END { if (v in f) print v, d, f[v] }' | sort -Vr -k1,1 | cut -d' ' -f2-)
    return 1
}

# PL/Proxy (the scaleout suite) built against the installation $1, when
# the archive serves a source of it; the suite says it is skipped if not.
build_plproxy() {   # PREFIX LOG
    local prefix=$1 log=$2 tarball build=$1.plproxy
    tarball=$(fetch_orig_tarball postgresql-plproxy "$PG_IDEM_CACHE/sources/plproxy") ||
        { echo "   PL/Proxy: no source the archive serves (the scaleout suite will be skipped)"; return 0; }
    rm -rf "$build" && mkdir -p "$build" && tar -xf "$tarball" -C "$build" --strip-components=1 &&
        make -C "$build" -s PG_CONFIG="$prefix/bin/pg_config" with_llvm=no >>"$log" 2>&1 &&
        make -C "$build" -s PG_CONFIG="$prefix/bin/pg_config" with_llvm=no install >>"$log" 2>&1 ||
        { echo "   PL/Proxy $(basename "$tarball") did not build (see $log; the scaleout suite will be skipped)"; rm -rf "$build"; return 0; }
    rm -rf "$build"
    echo "   PL/Proxy built from $(basename "$tarball")"
}

# configure + make + install of the fetched source into $4.
build_major_from_source() {
    local major=$1 version=$2 cassert=$3 dir=$4 src=$PG_IDEM_CACHE/sources/$1-$2
    local build=$dir.build log=$dir.build.log tarball flags=() start=$SECONDS m
    tarball=$(ls "$src"/postgresql-"$major"_*.orig.tar.* | head -1)
    say "building PostgreSQL $version from Debian's source package into $dir (once; a few minutes)"
    rm -rf "$build" "$dir"
    mkdir -p "$build"
    tar -xf "$tarball" -C "$build" --strip-components=1 || return 1
    flags=(--prefix="$dir" --enable-tap-tests --with-openssl --with-icu --without-llvm)
    if [ "$cassert" = 1 ]; then
        # Assertions, plus Valgrind's client requests so that the valgrind
        # suite sees palloc'd memory as PostgreSQL's own test runs do.
        flags+=(--enable-cassert --enable-debug CFLAGS="-O1 -g -fno-omit-frame-pointer" CPPFLAGS="-DUSE_VALGRIND")
    fi
    # A top-level make of its own: run from make test, the environment says
    # MAKELEVEL=1, and PostgreSQL's makefiles then leave the generated
    # headers (utils/errcodes.h, ...) to a parent that is not theirs, so a
    # parallel build may compile src/common before they exist.
    (
        unset MAKELEVEL MAKEFLAGS MFLAGS
        (cd "$build" && ./configure "${flags[@]}") &&
            make -C "$build" -j"$(nproc)" -s &&
            make -C "$build" -s install &&
            for m in $MAJOR_CONTRIB; do make -C "$build/contrib/$m" -j"$(nproc)" -s install || exit 1; done &&
            make -C "$build/src/test/regress" -s install &&
            make -C "$build/src/test/isolation" -j"$(nproc)" -s install &&
            make -C "$build/src/test/perl" -s install &&
            cp "$build/src/tools/valgrind.supp" "$dir/share/valgrind.supp"   # for the valgrind suite
    ) >"$log" 2>&1 || { tail -n 40 "$log" >&2; echo "build failed: $log" >&2; return 1; }
    rm -rf "$build"
    build_plproxy "$dir" "$log"
    echo "$dir" >"$dir/.complete"
    echo "   built in $((SECONDS - start)) s"
}

# The server, client and server-dev packages of major $1 unpacked into $2
# (usr/lib/postgresql/$1 inside).
unpack_major_debs() {
    local major=$1 dir=$2 debs=$2.debs p
    say "unpacking Debian's PostgreSQL $major binary packages into $dir (no source package to build)"
    rm -rf "$dir" "$debs"
    mkdir -p "$dir" "$debs"
    (cd "$debs" && major_apt download "postgresql-$major" "postgresql-client-$major" \
        "postgresql-server-dev-$major" >download.log 2>&1) || { cat "$debs/download.log" >&2; return 1; }
    for p in "$debs"/*.deb; do dpkg -x "$p" "$dir" || return 1; done
    rm -rf "$debs"
    write_pg_config_shim "$major" "$dir"
    echo "$dir/usr/lib/postgresql/$major" >"$dir/.complete"
}

# Debian's pg_config of a newer Debian cannot run here (glibc), and PGXS
# asks it for paths only: a script answering them for the unpacked tree.
write_pg_config_shim() {   # MAJOR DIR
    local major=$1 dir=$2 version
    version=$(sed -n 's/^VERSION = //p' "$dir/usr/lib/postgresql/$major/lib/pgxs/src/Makefile.global")
    cat >"$dir/pg_config" <<SHIM
#!/bin/sh
# pg_config for Debian's PostgreSQL $major unpacked into $dir (tests/majors.sh).
for o in "\$@"; do
    case \$o in
        --bindir) echo "$dir/usr/lib/postgresql/$major/bin" ;;
        --sharedir) echo "$dir/usr/share/postgresql/$major" ;;
        --includedir | --pkgincludedir) echo "$dir/usr/include/postgresql" ;;
        --includedir-server) echo "$dir/usr/include/postgresql/$major/server" ;;
        --libdir) echo "$dir/usr/lib/x86_64-linux-gnu" ;;
        --pkglibdir) echo "$dir/usr/lib/postgresql/$major/lib" ;;
        --pgxs) echo "$dir/usr/lib/postgresql/$major/lib/pgxs/src/makefiles/pgxs.mk" ;;
        --sysconfdir) echo "/etc/postgresql-common" ;;
        --mandir) echo "$dir/usr/share/postgresql/$major/man" ;;
        --docdir | --htmldir) echo "$dir/usr/share/doc/postgresql-doc-$major" ;;
        --localedir) echo "/usr/share/locale" ;;
        --version) echo "PostgreSQL $version" ;;
        --configure) echo "Debian's binary packages, unpacked" ;;
        *) echo "pg_config shim: \$o is not answered" >&2; exit 1 ;;
    esac
done
SHIM
    chmod 755 "$dir/pg_config"
}

# Whether the unpacked binaries of a newer Debian run on this machine
# (trixie's and experimental's need a newer glibc than Debian 12's).
major_binaries_run() {
    "$PG_PREFIX/bin/postgres" --version >/dev/null 2>&1
}

# For make test PG=N / CASSERT=1: the cached build replaces Debian's 15 as
# the installation the extension is built against and staged from.
prepare_postgres() {
    if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ] && [ "$CASSERT" != 1 ]; then
        PG_VERSION_FULL=$("$SYSTEM_PG_BIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')
        PG_FROM=debian
        return 0
    fi
    install_missing_packages $MAJOR_BUILD_PACKAGES
    ensure_major "$PG_MAJOR" "$CASSERT" || return 1
    SYSTEM_PG_BIN=$PG_PREFIX/bin
    PG_BIN=$SYSTEM_PG_BIN
}

# What the log names: "PostgreSQL 18.6 (assert-enabled build of Debian's
# source package)".
describe_postgres() {
    local how
    case $PG_FROM in
        debian) how="Debian's package" ;;
        source) how="build of Debian's source package, cached in $PG_IDEM_CACHE" ;;
        deb) how="Debian's binary packages unpacked into $PG_IDEM_CACHE" ;;
    esac
    [ "$CASSERT" = 1 ] && how="assert-enabled $how"
    echo "PostgreSQL $PG_VERSION_FULL ($how)"
}

# Whether the installation under test has extension $1 (PL/Proxy is
# Debian's, for 15 only).
postgres_has_extension() {
    [ -f "$("$PG_BIN/pg_config" --sharedir)/extension/$1.control" ]
}

# The extension built with -Wall -Wextra -Werror (the static suite's
# flags) against the headers of the installation PG_CONFIG_SHIM describes,
# in a copy of the tree at $1; counted as one test.
compile_against_headers() {
    local root=$1 build=$WORK/build-$PG_MAJOR log=$WORK/build-$PG_MAJOR.log
    say "building the extension against PostgreSQL $PG_VERSION_FULL's headers (-Wall -Wextra -Werror)"
    mkdir -p "$build"
    # Its pg_config.h describes a newer glibc, which has strlcpy and
    # strlcat (2.38); Debian 12's 2.36 declares neither, so declare them
    # (nothing is linked or run).
    printf '#include <stddef.h>\nextern size_t strlcpy(char *, const char *, size_t);\nextern size_t strlcat(char *, const char *, size_t);\n' \
        >"$WORK/newer_glibc.h"
    (cd "$root" && tar --exclude=./.git --exclude=./build --exclude='*.o' --exclude='*.bc' --exclude='*.so' -cf - Makefile extension) |
        (cd "$build" && tar -xf -)
    # Its CFLAGS are for its own gcc (Debian 13's 14): drop the options
    # Debian 12's gcc 12 does not know.
    local global cflags
    global=$(dirname "$("$PG_CONFIG_SHIM" --pgxs)")/../Makefile.global
    # (COPT would be ignored beside CFLAGS on the command line.)
    cflags=$(sed -n 's/^CFLAGS = //p' "$global" | sed -E 's/ -W(no-)?missing-variable-declarations//g')
    cflags+=" -include $WORK/newer_glibc.h -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror"
    if make -C "$build" -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG_SHIM" with_llvm=no \
            CFLAGS="$cflags" PERMIT_MISSING_VARIABLE_DECLARATIONS= >"$log" 2>&1; then
        count "build against PostgreSQL $PG_VERSION_FULL" 1 0
    else
        grep -E 'error|warning' "$log" | head -n 40
        count "build against PostgreSQL $PG_VERSION_FULL" 0 1
    fi
}
