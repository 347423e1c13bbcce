# Suite of tests/run.sh: pg_regress (sql/) and a few isolation specs on a
# second server that runs under valgrind memcheck.  Sourced; uses count,
# say, as_run_user, $WORK, $PG_BIN.
#
# Fails on any memcheck error with a pg_idem frame in its stack (a frame in
# pg_idem.so, or in a file under extension/); errors entirely in other code
# (PostgreSQL, libc) are listed and saved, but do not fail the suite.
#
# Debian's PostgreSQL is not built with USE_VALGRIND: its memory contexts
# hand out reused chunks without telling memcheck, so a read of a palloc'd
# chunk's stale contents, or just past a chunk inside its block, goes
# unseen.  What memcheck does see: uninitialised stack variables and fresh
# malloc'd blocks, reads past or before a malloc'd block, system calls
# given undefined bytes.
#
# Suppressions: tests/valgrind/*.supp, plus any files named in
# VALGRIND_SUPPRESSIONS (e.g. PostgreSQL's src/tools/valgrind.supp from a
# source tree: Debian does not ship it, and most of its entries name
# static functions, which Debian's build leaves without symbols).
#
# make test runs the fast part (VALGRIND_REGRESS below, every sql/ test,
# plus VALGRIND_ISOLATION_FAST); SUITES=valgrind runs every regression
# test and the longer isolation subset VALGRIND_ISOLATION
# (VALGRIND_ISOLATION=all: every spec).

VALGRIND_ISOLATION_FAST="claim_followers claim_rebuild_under_invalidations inbox_cap_race outbox_stale_ack"
VALGRIND_ISOLATION=${VALGRIND_ISOLATION:-"claim_followers claim_rebuild_under_invalidations claim_two_stealers claim_cooldown_claimants
claim_in_transaction inbox_cap_race inbox_concurrent_delivery outbox_drainers
outbox_stale_ack attempt_duplicate_open attempt_late_put"}

# Sourced before run.sh replaces SUITES: was this suite asked for by name?
VALGRIND_ASKED=0
[[ " ${SUITES:-} " == *" valgrind "* ]] && VALGRIND_ASKED=1

suite_valgrind() {
    local vg=$WORK/valgrind port iso supp started finished
    if ! command -v valgrind >/dev/null; then
        say "valgrind: not installed"
        count valgrind 0 1
        return
    fi
    if [ "$VALGRIND_ASKED" = 1 ]; then iso=$VALGRIND_ISOLATION; else iso=$VALGRIND_ISOLATION_FAST; fi
    iso=$(echo $iso)                # one line, for make
    local isoarg=(ISOLATION="$iso")
    [ "$iso" = all ] && isoarg=()   # every spec
    say "valgrind memcheck: a second server, pg_regress and isolation ($iso)"
    started=$(date +%s)
    as_run_user mkdir -p "$vg/log" "$vg/regress" "$vg/isolation"
    as_run_user "$PG_BIN/initdb" -D "$vg/data" -A trust -U "$PGUSER" -E UTF8 \
        --locale=C.UTF-8 >"$vg/initdb.log" 2>&1 || { cat "$vg/initdb.log"; count valgrind 0 1; return; }
    port=$(free_port)
    {
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$vg'"
        echo "port = $port"
        echo "shared_preload_libraries = 'pg_idem'"
        echo "fsync = off"
        echo "max_connections = 30"
        echo "autovacuum = off"
        echo "jit = off"
        echo "max_parallel_workers_per_gather = 0"
    } | as_run_user tee -a "$vg/data/postgresql.conf" >/dev/null
    # Whether valgrind can run this server at all: PostgreSQL 19 probes the
    # CPU's clock at start (rdtscp, as valgrind's simulated CPU advertises),
    # which Debian 12's valgrind 3.19 cannot execute on a CPU without
    # rdtscp (a virtual machine's, often).
    if ! as_run_user valgrind --quiet --error-exitcode=0 "$PG_BIN/postgres" -D "$vg/data" \
            -C server_version >"$vg/probe.log" 2>&1; then
        grep -q 'Illegal opcode' "$vg/probe.log" && {
            skip_suite valgrind "valgrind $(valgrind --version | sed 's/valgrind-//') stops PostgreSQL $PG_VERSION_FULL at its start: an instruction it cannot run on this CPU, in $(grep -m1 -oE '(at|by) 0x[0-9A-F]+: [A-Za-z_][A-Za-z_0-9]*' "$vg/probe.log" | awk '{print $3}')"
            return
        }
    fi
    # pg_ctl starts the postmaster through this wrapper; every backend is
    # a fork of it, so all of them run under memcheck.
    supp=""
    # A source build (make test PG=18) keeps PostgreSQL's own suppressions.
    for f in "$WORK"/src/tests/valgrind/*.supp ${PG_PREFIX:+"$PG_PREFIX/share/valgrind.supp"} ${VALGRIND_SUPPRESSIONS:-}; do
        [ -f "$f" ] && supp="$supp --suppressions=$f"
    done
    as_run_user tee "$vg/postgres" >/dev/null <<WRAPPER
#!/bin/sh
TMPDIR=$vg
export TMPDIR
exec valgrind --quiet --tool=memcheck --trace-children=yes --track-origins=yes \
    --leak-check=no --read-var-info=no --num-callers=40 --fullpath-after= \
    --error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END $supp \
    --log-file=$vg/log/%p.log "$PG_BIN/postgres" "\$@"
WRAPPER
    as_run_user chmod 755 "$vg/postgres"
    if ! as_run_user "$PG_BIN/pg_ctl" -D "$vg/data" -p "$vg/postgres" -l "$vg/server.log" \
            -t 600 -w start >/dev/null; then
        tail -n 50 "$vg/server.log"
        count valgrind 0 1
        return
    fi

    local log=$vg/tests.log ok bad
    (
        PGHOST=$vg PGPORT=$port
        as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck \
            ISOLATION= TAP_TESTS= EXTRA_REGRESS_OPTS="--outputdir=$vg/regress"
        as_run_user make -C "$WORK/src" -s PG_CONFIG="$PG_BIN/pg_config" installcheck \
            REGRESS= TAP_TESTS= "${isoarg[@]}" EXTRA_REGRESS_OPTS="--outputdir=$vg/isolation"
    ) >"$log" 2>&1
    as_run_user "$PG_BIN/pg_ctl" -D "$vg/data" -m fast -t 600 -w stop >/dev/null 2>&1
    finished=$(date +%s)
    grep -E '\.\.\. |^(ok|not ok) [0-9]' "$log"
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]' "$log")
    bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]|failed \(ignored\)' "$log")
    [ "$bad" -gt 0 ] && cat "$vg"/regress/regression.diffs "$vg"/isolation/regression.diffs 2>/dev/null | head -c 20000
    count "valgrind: tests under memcheck" "$ok" "$bad"

    # One error per block between the markers; ours if a frame is ours.
    # Each block starts with "== error (process log)"; the same error in
    # several backends counts once per distinct stack (its first frames).
    : >"$vg/ours.txt"
    : >"$vg/others.txt"
    awk -v ours="$vg/ours.txt" -v others="$vg/others.txt" '
        /VALGRINDERROR-BEGIN/ { inblock = 1; block = "== error (" FILENAME ")\n"; next }
        /VALGRINDERROR-END/ {
            inblock = 0
            if (block ~ /pg_idem\.so|\/extension\/[A-Za-z0-9_]+\.[ch]:[0-9]+/) print block > ours
            else print block > others
            next
        }
        inblock { sub(/^==[0-9]+== ?/, ""); block = block $0 "\n" }
    ' "$vg"/log/*.log
    local ours others
    ours=$(valgrind_distinct "$vg/ours.txt")
    others=$(valgrind_distinct "$vg/others.txt")
    echo "valgrind: $((finished - started)) s; distinct errors with a pg_idem frame: $ours;" \
        "elsewhere: $others (in $vg/others.txt)"
    if [ "$others" -gt 0 ]; then
        echo "valgrind: errors outside pg_idem (not failing; in $vg/others.txt):"
        valgrind_signatures "$vg/others.txt" | head -n 40
    fi
    if [ "$ours" -gt 0 ]; then
        valgrind_signatures "$vg/ours.txt"
        head -c 20000 "$vg/ours.txt"
        count "valgrind: pg_idem errors" 0 "$ours"
    else
        count "valgrind: pg_idem errors" 1 0
    fi
}

# The distinct stacks in a file of error blocks: the error's first line
# and its first four frames' functions, one line per error.
valgrind_signatures() {
    awk '
        /^== error/ { if (sig != "") print sig; sig = ""; n = -1; next }
        n == -1 { sig = $0; n = 0; next }
        /^ *(at|by) 0x/ && n >= 0 && n < 4 { sig = sig " | " $3; n++; next }
        /^ *$/ { if (n > 0) n = 4 }
        END { if (sig != "") print sig }
    ' "$1" | sort | uniq -c | sort -rn
}

valgrind_distinct() {
    valgrind_signatures "$1" | wc -l
}
