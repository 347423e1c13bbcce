#!/usr/bin/env bash
# The docs' install lines, as written, on a fresh Debian 12 (the
# fresh_debian suite, tests/suites/84_fresh_debian.sh).
#
#   tests/fresh_debian/run.sh TREE SCRATCH
#
# TREE is a copy of the repository (its tracked files are used); SCRATCH a
# directory for the logs.  Prints "ok NAME" / "not ok NAME" lines.
#
# The system: `debootstrap --variant=minbase bookworm` (with sudo: the
# README's lines are for root or a user with sudo) from the Debian mirror
# this machine uses, cached as a tarball in $PG_IDEM_CACHE/fresh-debian.
# Each run unpacks it into a tmpfs in private mount and PID namespaces
# (unshare): when the run ends, on any path, the kernel ends every process
# started in it and removes every mount.  Into it goes what this machine
# gives any system on its network: its resolver, its extra CA certificates
# (the npm registry is reached through them) and its apt Acquire settings;
# plus a policy-rc.d that keeps packages from starting services (a chroot
# shares the machine's network) and dpkg's unsafe-io (a throwaway system).
# Then, as the user "dev" (sudo without password), from a copy of the
# repository in ~/pg_idem: every <!-- install: --> block of README.md and
# client/*/README.md (tests/fresh_debian/blocks.py), with bash -e, in
# order; then tests/fresh_debian/prove.sh.
#
# The cost is dpkg installing some 500 packages (4 minutes on the 2-core
# machine).  So the packages are cached too: a snapshot of the system after
# only the blocks' apt-get lines, keyed by those lines' text, at most 7
# days old.  A run with the snapshot still runs every block as written
# (apt-get update and apt-get install find the packages installed); a
# changed apt-get line makes a new snapshot from the base.  The .deb files
# are kept in the cache as well (a new snapshot downloads nothing).
#
# The mirror must answer: a network failure is a failure, said as such.
set -uo pipefail
TREE=$1
SCRATCH=$2
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${PG_IDEM_CACHE:?}/fresh-debian
SNAPSHOT_DAYS=7
mkdir -p "$CACHE/debs" "$SCRATCH" || exit 1

# The Debian mirror the machine uses (as tests/majors.sh's major_apt finds
# it) and its security archive.
sources=$(grep -rhE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null)
MIRROR=$(grep -oE 'https?://[^ ]+/debian/?( |$)' <<<"$sources" | head -1 | tr -d ' ')
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=$(grep -oE 'https?://[^ ]+/debian-security/?( |$)' <<<"$sources" | head -1 | tr -d ' ')
SECURITY=${SECURITY:-${MIRROR%/debian*}/debian-security}

exec {lock}>"$CACHE/.lock"
flock "$lock"

BASE=$CACHE/bookworm-minbase.tar.zst
if [ ! -f "$BASE" ]; then
    started=$SECONDS
    echo "debootstrap --variant=minbase bookworm from $MIRROR (once; cached in $BASE)"
    rm -rf "$CACHE/base.build"
    if ! debootstrap --variant=minbase --include=sudo bookworm "$CACHE/base.build" "$MIRROR" \
            >"$SCRATCH/debootstrap.log" 2>&1; then
        tail -n 20 "$SCRATCH/debootstrap.log"
        grep -qiE 'Failed getting|Couldn.t download|Temporary failure|Could not resolve|connection' \
            "$SCRATCH/debootstrap.log" && echo "the Debian mirror $MIRROR did not answer: a network failure, not a skip"
        rm -rf "$CACHE/base.build"
        echo "not ok debootstrap bookworm from $MIRROR"
        exit 0
    fi
    rm -rf "$CACHE"/base.build/var/lib/apt/lists/* "$CACHE"/base.build/var/cache/apt/archives/*.deb
    tar --zstd -C "$CACHE/base.build" -cf "$BASE.part" . && mv "$BASE.part" "$BASE" || exit 1
    rm -rf "$CACHE/base.build"
    echo "ok debootstrap bookworm ($((SECONDS - started)) s)"
fi

# The blocks, and the key of their apt-get lines.
python3 "$HERE/blocks.py" "$TREE" >"$SCRATCH/blocks.sh" || { echo "not ok the docs' install blocks"; exit 0; }
python3 "$HERE/blocks.py" "$TREE" --apt >"$SCRATCH/apt.sh" || exit 1
key=$( (grep -v '^# ==' "$SCRATCH/apt.sh"; echo "$MIRROR $SECURITY"; stat -c %Y "$BASE") | sha256sum | cut -c1-16)
SNAP=$CACHE/packages-$key.tar.zst
find "$CACHE" -maxdepth 1 -name 'packages-*.tar.zst' -mtime +$((SNAPSHOT_DAYS - 1)) -delete
grep -c '^# ==' "$SCRATCH/blocks.sh" | xargs printf '%s install blocks: '
grep '^# ==' "$SCRATCH/blocks.sh" | cut -c6- | paste -sd';' | sed 's/;/; /g'

# The repository's tracked files (git ls-files of the harness's copy).
(cd "$TREE" && if [ -f .tracked-files ]; then tr '\0' '\n' <.tracked-files; else git ls-files; fi) \
    >"$SCRATCH/files" || exit 1

export HERE CACHE MIRROR SECURITY BASE SNAP SCRATCH TREE
unshare --mount --propagation private --pid --fork bash "$HERE/inside.sh"
