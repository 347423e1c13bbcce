#!/usr/bin/env bash
# tests/fresh_debian/run.sh's second half, in its private mount and PID
# namespaces (the variables come from it): the system in a tmpfs, the
# install blocks as the user dev, then prove.sh.  Everything mounted here
# and every process started here ends with this script.
set -uo pipefail
R=$SCRATCH/root
mkdir -p "$R" && mount -t tmpfs -o size=8g,mode=755 fresh-debian "$R" || { echo "not ok a tmpfs for the system"; exit 0; }

in_root() {   # in_root COMMAND...: as root in the system, a clean environment
    chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}
as_dev() {    # as_dev SCRIPT LOG: a script of ~dev, as dev's login shell, from ~/pg_idem
    in_root runuser -l dev -c "cd ~/pg_idem && bash -e -o pipefail $1" >"$2" 2>&1
}

# What this machine gives any system on its network, and what a throwaway
# system in a chroot needs.
machine_setup() {
    cp /etc/resolv.conf "$R/etc/resolv.conf"
    printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" >"$R/etc/hosts"
    mkdir -p "$R/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null
    apt-config dump | grep -E '^Acquire::Check-(Valid-Until|Date) ' >"$R/etc/apt/apt.conf.d/99machine"
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
        "$MIRROR" "$MIRROR" "$SECURITY" >"$R/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d" && chmod 755 "$R/usr/sbin/policy-rc.d"
    echo force-unsafe-io >"$R/etc/dpkg/dpkg.cfg.d/unsafe-io"
    in_root id dev >/dev/null 2>&1 || in_root useradd -m -s /bin/bash dev || return 1
    echo 'dev ALL=(ALL) NOPASSWD: ALL' >"$R/etc/sudoers.d/dev" && chmod 440 "$R/etc/sudoers.d/dev"
    mkdir -p "$R/home/dev/pg_idem"
}

started=$SECONDS
if [ -f "$SNAP" ]; then
    tar --zstd -xf "$SNAP" -C "$R" || { echo "not ok unpack $SNAP"; exit 0; }
    echo "the system: the cached snapshot $(basename "$SNAP") (the blocks' apt-get lines done; $((SECONDS - started)) s)"
    snapshot=1
else
    tar --zstd -xf "$BASE" -C "$R" || { echo "not ok unpack $BASE"; exit 0; }
    snapshot=0
fi
machine_setup || { echo "not ok the system's setup"; exit 0; }
mount -t proc proc "$R/proc" && mount -t tmpfs shm "$R/dev/shm" &&
    mount --bind "$CACHE/debs" "$R/var/cache/apt/archives" || { echo "not ok mounts in the system"; exit 0; }

if [ "$snapshot" = 0 ]; then
    # The packages: only the blocks' apt-get lines, as written, then the snapshot.
    echo "the system: debootstrap's base; the blocks' apt-get lines, then a snapshot (once per change of them)"
    cp "$SCRATCH/apt.sh" "$R/home/dev/apt.sh"
    if ! as_dev '~/apt.sh' "$SCRATCH/apt.log"; then
        tail -n 30 "$SCRATCH/apt.log"
        grep -qE '^(Err|W: Failed to fetch|E: Failed to fetch)|Temporary failure resolving|Could not connect' "$SCRATCH/apt.log" &&
            echo "the Debian mirror ($MIRROR, $SECURITY) did not answer: a network failure, not a skip"
        echo "not ok the install blocks' apt-get lines"
        exit 0
    fi
    t=$SECONDS
    tar --zstd --one-file-system -C "$R" -cf "$SNAP.part" . && mv "$SNAP.part" "$SNAP" &&
        find "$(dirname "$SNAP")" -maxdepth 1 -name 'packages-*.tar.zst' ! -name "$(basename "$SNAP")" -delete
    echo "ok the install blocks' apt-get lines on debootstrap's base ($((t - started)) s; snapshot $((SECONDS - t)) s)"
fi

# The repository, as a user who cloned it.
(cd "$TREE" && tar -cf - -T "$SCRATCH/files") | tar -xf - -C "$R/home/dev/pg_idem" || { echo "not ok copy the repository"; exit 0; }
cp "$HERE/prove.sh" "$R/home/dev/prove.sh"
awk '/^# == / {n++; f=sprintf("'"$R"'/home/dev/block%02d.sh", n)} {print > f}' "$SCRATCH/blocks.sh"
in_root chown -R dev: /home/dev

failed=0
for b in "$R"/home/dev/block*.sh; do
    name=$(head -n 1 "$b" | cut -c6-)
    t=$SECONDS
    if as_dev "~/$(basename "$b")" "$SCRATCH/$(basename "$b" .sh).log"; then
        echo "ok block $name ($((SECONDS - t)) s)"
    else
        sed 1d "$b"
        tail -n 30 "$SCRATCH/$(basename "$b" .sh).log"
        grep -qE '^(Err|W: Failed to fetch|E: Failed to fetch)|Temporary failure resolving|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN' \
            "$SCRATCH/$(basename "$b" .sh).log" && echo "a package registry did not answer: a network failure, not a skip"
        echo "not ok block $name"
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 0
t=$SECONDS
in_root runuser -l dev -c 'bash ~/prove.sh' 2>&1
echo "proofs: $((SECONDS - t)) s"
