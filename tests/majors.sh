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
#   - from the binary packages otherwise (trixie's 17, experimental's
#     19~rc1, whose sources answer 404): dpkg -x of the server, client,
#     server-dev and libpq packages into the cache.  They are built for a
#     newer C library than Debian 12's, so they get a private one: the
#     library packages they depend on (sid's glibc 2.43, ICU, OpenSSL,
#     ...) unpacked beside them, and their executables and libraries
#     patched to load it (major_private_runtime).  Debian's server-dev
#     package has pg_regress, isolationtester and the TAP modules, so
#     every suite runs.  A binary build cannot be assert-enabled.
#
# The cache: $PG_IDEM_CACHE, by default /var/cache/pg_idem for root and
# ~/.cache/pg_idem for other users; one directory per version and flags
# (postgresql-18.6, postgresql-18.6-cassert, postgresql-19~rc1-deb, ...).
# A directory is used only once its build finished (the .complete file);
# remove it to rebuild.

PG_IDEM_CACHE=${PG_IDEM_CACHE:-$(if [ "$(id -u)" = 0 ]; then echo /var/cache/pg_idem; else echo "${XDG_CACHE_HOME:-$HOME/.cache}/pg_idem"; fi)}

# The contrib modules the suites load (amcheck, dblink, auto_explain and the
# usual maintenance and decoding tools a test may reach for).
MAJOR_CONTRIB="amcheck dblink auto_explain pageinspect test_decoding pg_stat_statements
pg_visibility pgstattuple pg_walinspect pg_buffercache postgres_fdw pg_prewarm"

# Packages a source build needs on top of IDEM_PACKAGES.
MAJOR_BUILD_PACKAGES="bison flex libreadline-dev zlib1g-dev libssl-dev libicu-dev
dpkg-dev xz-utils bzip2 patchelf"

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
    PG_VERSION_FULL=$("$PG_PREFIX/bin/postgres" --version | sed 's/^postgres (PostgreSQL) //')
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
# PostgreSQL 19 refuses standard_conforming_strings = off and no longer
# exports the variable, which PL/Proxy 2.11's scanner reads: for 19 it is
# the constant true.
build_plproxy() {   # PREFIX LOG
    local prefix=$1 log=$2 tarball build=$1.plproxy extra=
    grep -qs 'bool standard_conforming_strings' "$("$prefix/bin/pg_config" --includedir-server)/parser/parser.h" ||
        extra=-Dstandard_conforming_strings=true
    tarball=$(fetch_orig_tarball postgresql-plproxy "$PG_IDEM_CACHE/sources/plproxy") ||
        { echo "   PL/Proxy: no source the archive serves (the scaleout suite will be skipped)"; return 0; }
    rm -rf "$build" && mkdir -p "$build" && tar -xf "$tarball" -C "$build" --strip-components=1 &&
        make -C "$build" -s PG_CONFIG="$prefix/bin/pg_config" with_llvm=no EXTRA_CPPFLAGS="$extra" >>"$log" 2>&1 &&
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

# The binary packages of major $1 (server, client, server-dev, and the libpq
# and its headers of the same version) unpacked into $2 (usr/lib/postgresql/$1
# inside).  A newer Debian's binaries need a newer C library than this
# machine's: they then run on a private runtime (major_private_runtime).
# PGXS is adapted to this machine's compiler (major_adapt_pgxs) and
# PL/Proxy built, as for a source build.
unpack_major_debs() {
    local major=$1 dir=$2 debs=$2.debs log=$2.build.log version prefix p start=$SECONDS
    version=$(major_apt_cache show "postgresql-$major" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)
    prefix=$dir/usr/lib/postgresql/$major
    say "unpacking Debian's PostgreSQL $version binary packages into $dir (no source package to build; once)"
    rm -rf "$dir" "$debs"
    mkdir -p "$dir" "$debs"
    (cd "$debs" && major_apt download "postgresql-$major=$version" "postgresql-client-$major=$version" \
        "postgresql-server-dev-$major=$version" "libpq5=$version" "libpq-dev=$version") >"$log" 2>&1 ||
        { tail -n 20 "$log" >&2; return 1; }
    for p in "$debs"/*.deb; do dpkg -x "$p" "$dir" || return 1; done
    rm -rf "$debs"
    if ! "$prefix/bin/postgres" --version >/dev/null 2>&1; then
        major_private_runtime "$major" "$version" "$dir" >>"$log" 2>&1 ||
            { tail -n 30 "$log" >&2; echo "PostgreSQL $version: no runtime for its binaries (see $log)" >&2; return 1; }
        echo "   its binaries need a newer C library than this machine's: they run on a private one, in $dir/runtime"
    fi
    "$prefix/bin/postgres" --version >/dev/null 2>>"$log" || { tail -n 5 "$log" >&2; return 1; }
    major_adapt_pgxs "$dir" "$major" >>"$log" 2>&1 || { tail -n 20 "$log" >&2; return 1; }
    build_plproxy "$prefix" "$log"
    echo "$prefix" >"$dir/.complete"
    echo "   ready in $((SECONDS - start)) s"
}

# Debian packages named as libraries: what a runtime is made of (libpq
# comes with the installation).
major_library_packages() {
    grep -E '^(lib|zlib1g$)' | grep -vE -- '-(dev|bin|doc)$' | grep -vx 'libpq5'
}

# The first real package of each dependency of packages "$@" (the first
# alternative of a group that is not virtual), one a line.
major_package_depends() {
    major_apt_cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances "$@" 2>/dev/null | awk '
        /^ *\|?(Pre)?Depends:/ {
            alt = ($1 ~ /^\|/)
            if (!taken && $2 !~ /^</) { print $2; taken = 1 }
            if (!alt) taken = 0
        }'
}

# A private runtime for the binaries unpacked into $3: the shared libraries
# they need (Debian's library packages the server, the client and libpq of
# version $2 depend on, and theirs, at the archive's candidate versions:
# sid's C library for experimental's 19) unpacked into $3/runtime, and
# every executable and shared object of the installation patched
# (patchelf) to load with that runtime's dynamic loader and to find its
# libraries there first (a DT_RPATH, which also serves the modules a
# server loads: contrib, PL/Proxy, pg_idem).  The programs exec each other
# (initdb and pg_ctl start postgres, pg_upgrade runs pg_dump) by path, so
# each patched file finds the runtime by itself; nothing in the
# environment is needed, and this machine's own programs are untouched.
# A module built here against the older C library loads into the newer
# one.  Fails unless every library of every patched file resolves inside
# the installation or the runtime.
major_private_runtime() {   # MAJOR VERSION DIR
    local major=$1 version=$2 dir=$3 rt=$3/runtime debs=$3/runtime.debs
    local multiarch queue seen=" " p interp rpath f elves outside missing=0
    multiarch=$(gcc -print-multiarch)
    queue=$(major_package_depends "postgresql-$major=$version" "postgresql-client-$major=$version" \
        "libpq5=$version" | major_library_packages)
    # Breadth first, one apt-cache call per level.
    while [ -n "$queue" ]; do
        local level=()
        for p in $queue; do
            [[ $seen == *" $p "* ]] && continue
            seen+="$p "
            level+=("$p")
        done
        [ ${#level[@]} -gt 0 ] || break
        queue=$(major_package_depends "${level[@]}" | major_library_packages | sort -u)
    done
    echo "runtime packages:$seen"
    rm -rf "$rt" "$debs"
    mkdir -p "$rt" "$debs"
    # (libc6-dbg: the symbols valgrind needs of the loader, below.)
    (cd "$debs" && major_apt download $seen libc6-dbg) || return 1
    [ "$(dpkg-deb -f "$debs"/libc6_*.deb Version)" = "$(dpkg-deb -f "$debs"/libc6-dbg_*.deb Version)" ] ||
        rm -f "$debs"/libc6-dbg_*.deb
    for p in "$debs"/*.deb; do dpkg -x "$p" "$rt" || return 1; done
    rm -rf "$debs"
    interp=$(find "$rt" -name 'ld-linux*.so.*' -type f | head -1)
    [ -n "$interp" ] || { echo "no dynamic loader in the runtime"; return 1; }
    major_runtime_debug_links "$rt"
    rpath=$rt/usr/lib/$multiarch:$rt/lib/$multiarch:$dir/usr/lib/$multiarch
    elves=$(find "$dir/usr" -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) \
        -exec sh -c 'head -c 4 "$1" | grep -q ELF && echo "$1"' sh {} \;)
    for f in $elves; do
        if [[ $(readelf -l "$f" 2>/dev/null) == *"program interpreter"* ]]; then
            patchelf --set-interpreter "$interp" "$f" || return 1
        fi
        patchelf --force-rpath --set-rpath "$rpath" "$f" || return 1
    done
    for f in $elves; do
        # Every line of the loader's list names a file of the runtime or
        # the installation (or the kernel's vDSO).
        outside=$("$interp" --list "$f" 2>&1 |
            grep -vE "=> ($rt|$dir)/|linux-vdso|^[[:space:]]*$rt/|statically linked")
        if [ -n "$outside" ]; then
            printf 'unresolved in the runtime: %s\n%s\n' "$f" "$outside"
            missing=1
        fi
    done
    [ "$missing" = 0 ]
}

# Valgrind (the valgrind suite) refuses a program whose dynamic loader has
# no symbols (it must redirect the loader's strlen).  Debian's libraries
# name their separate debug file by a debug link, which valgrind looks for
# beside the library; libc6-dbg has them under /usr/lib/debug/.build-id:
# link each where valgrind looks.
major_runtime_debug_links() {   # RUNTIME
    local rt=$1 f id name debug
    for f in "$rt"/usr/lib/*/ld-linux*.so.* "$rt"/usr/lib/*/libc.so.6; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        id=$(readelf -n "$f" 2>/dev/null | awk '/Build ID/ {print $3}')
        name=$(readelf --string-dump=.gnu_debuglink "$f" 2>/dev/null | awk '/\[ *0\]/ {print $3}')
        debug=$rt/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug
        [ -n "$id" ] && [ -n "$name" ] && [ -f "$debug" ] && ln -f "$debug" "$(dirname "$f")/$name"
    done
    true
}

# The PGXS of a newer Debian, for this machine's compiler: its CFLAGS
# without the options Debian 12's gcc does not know (-Wmissing-variable-
# declarations), no LLVM bitcode (its clang is not here), and, where its
# pg_config.h says the C library declares strlcpy and strlcat (glibc 2.38)
# and this machine's does not (2.36), their declarations (the server's own
# C library defines them).  Builds against it then need nothing special.
major_adapt_pgxs() {   # DIR MAJOR
    local global=$1/usr/lib/postgresql/$2/lib/pgxs/src/Makefile.global
    local compat=$1/usr/include/postgresql/idem-older-libc.h flag cflags=
    for flag in $(sed -n 's/^CFLAGS = //p' "$global"); do
        if [[ $(echo 'int x;' | gcc "$flag" -x c -c -o /dev/null - 2>&1) == *unrecognized* ]]; then
            echo "PGXS: dropping $flag (unknown to gcc $(gcc -dumpversion))"
        else
            cflags+=" $flag"
        fi
    done
    sed -i -e "s|^CFLAGS = .*|CFLAGS =$cflags|" -e 's|^with_llvm\s*=.*|with_llvm = no|' "$global"
    if grep -q '^#define HAVE_DECL_STRLCPY 1' "$1/usr/include/postgresql/$2/server/pg_config.h" &&
       ! printf '#include <string.h>\nvoid *p = (void *) strlcpy;\n' | gcc -Werror -x c -c -o /dev/null - 2>/dev/null; then
        printf '%s\n' "/* tests/majors.sh: declared by the server's C library, not by this machine's. */" \
            '#include <stddef.h>' 'extern size_t strlcpy(char *, const char *, size_t);' \
            'extern size_t strlcat(char *, const char *, size_t);' >"$compat"
        sed -i "s|^CPPFLAGS = |CPPFLAGS = -include $compat |" "$global"
    fi
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
        deb) how="Debian's binary packages unpacked into $PG_IDEM_CACHE"
            [ -d "$PG_PREFIX/../../../../runtime" ] && how+=", on a private runtime of a newer Debian's C library" ;;
    esac
    [ "$CASSERT" = 1 ] && how="assert-enabled $how"
    echo "PostgreSQL $PG_VERSION_FULL ($how)"
}

# Whether the installation under test has extension $1 (PL/Proxy is
# Debian's, for 15 only).
postgres_has_extension() {
    [ -f "$("$PG_BIN/pg_config" --sharedir)/extension/$1.control" ]
}
