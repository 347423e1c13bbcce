#!/usr/bin/python3
"""Follower wake-up for make bench's growth section (tests/bench/growth.sh).

One winner claims a key; N followers, each on a connection of its own, call
idem_claim with max_wait and sleep inside the database; once every follower
that can reach a server sleeps (its backend in the wait event Extension),
the winner finalizes.  What is measured is the time from the winner sending
its finalize (autocommit: its commit wakes the followers) to each follower's
answer reaching the harness.

The harness must not be what it measures.  The default one (--harness loop):
  - one thread drives every connection (libpq's asynchronous calls, one
    epoll loop); an answer is stamped when its socket turns readable and is
    parsed only after every answer has been stamped;
  - connections are opened once per path and follower count and kept over
    the rounds, after a warm-up round 0 that is not counted, as an
    application's pool keeps them.
Two others are there to measure what a harness adds (docs/benchmarks.md,
"Follower wake-up"): --harness fresh is the same loop on new connections
every round; --harness threads is this script's first version, a thread and
a new connection per follower per round, stamped after psycopg returns the
row (python3-psycopg is its pure-Python build: every libpq call releases
and retakes the GIL).
Every harness also has each follower's backend stamp its answer
(clock_timestamp() in the statement, after the wait returned; the same host
clock as time.time()): server_ms splits the server's share from the
delivery's.  finalize_ms is when the winner's commit (with its broadcast)
returned to it; slept and woken (idem_stats, per round) how many followers
slept in the server and how many sleeps a commit ended; switches the
times the harness's threads blocked from the finalize to their answers;
cpu_us the CPU the sleeping followers' backends ran from the finalize to
the last answer, per follower (through PgBouncer: the pool's backends,
which answer every follower).
Through PgBouncer in transaction mode (pool 5) only 5 followers hold a
server connection at once: the rest queue in the pooler, and their time
includes the queue.
Prints CSV: harness,path,followers,round,follower,ms,server_ms,finalize_ms,
slept,woken,switches,cpu_us,outcome.
"""
import argparse
import hashlib
import os
import selectors
import sys
import threading
import time

import psycopg
from psycopg import pq

HASH = "\\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"
# The marker lets the harness find its followers' backends in pg_stat_activity.
FOLLOW = ("SELECT /* growth_wakeup follower */ r.outcome,"
          " extract(epoch FROM clock_timestamp())::float8"
          " FROM idem_claim($1::bytea, $2::bytea, '30 s'::interval, '60 s'::interval) r")
FINALIZE = b"SELECT idem_finalize($1::bytea, $2::uuid, 200, '{}'::jsonb, 'ok'::bytea)"


def switches(tid=None):
    """Context switches of a thread of this process so far (Linux; default:
    the calling thread)."""
    path = f"/proc/self/task/{tid}/status" if tid else "/proc/thread-self/status"
    with open(path) as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)


def sleeping(admin):
    # The backends of followers asleep in the claim's wait (wakeup.c's
    # condition variable: wait event type Extension).
    return [r[0] for r in admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Extension'"
        " AND query LIKE '%growth_wakeup follower%' AND pid <> pg_backend_pid()")]


def wait_until_asleep(admin, expected):
    deadline = time.monotonic() + 60
    pids = sleeping(admin)
    while len(pids) < expected and time.monotonic() < deadline:
        time.sleep(0.005)
        pids = sleeping(admin)
    return pids


def wait_until_gone(admin, pids):
    # A closed connection's backend exits on its own time: without this the
    # next cell would be measured while 100 backends tear down.
    deadline = time.monotonic() + 30
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                        (pids,)).fetchone()[0] and time.monotonic() < deadline:
        time.sleep(0.01)


def cpu_ns(pids):
    """CPU time the processes have run, in ns (/proc/PID/schedstat; None
    when a server's processes cannot be read from here)."""
    try:
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total
    except OSError:
        return None


def wake_counts(admin):
    # idem_stats: claims that slept in the server, and sleeps a commit ended
    # (counted when each follower's transaction commits).
    return tuple(admin.execute(
        "SELECT sum(value) FILTER (WHERE counter = 'follower_waits'),"
        " sum(value) FILTER (WHERE counter = 'follower_wakeups') FROM idem_stats()").fetchone())


def result_of(conn):
    """The result of conn's one query (blocking): (row, None) or (None, error)."""
    conn.nonblocking = 0
    res = conn.get_result()
    while conn.get_result() is not None:
        pass
    if res is not None and res.status == pq.ExecStatus.TUPLES_OK:
        return [res.get_value(0, j).decode() for j in range(res.nfields)], None
    msg = (conn.error_message if res is None else res.error_message).decode(errors="replace")
    return None, (msg.strip().splitlines() or ["no result"])[0]


def connect(dsn, n):
    conns = [pq.PGconn.connect(dsn.encode()) for _ in range(n)]
    for c in conns:
        if c.status != pq.ConnStatus.OK:
            sys.exit(f"growth_wakeup: {c.error_message.decode(errors='replace').strip()}")
    return conns


def loop_round(key, claim_id, winner, admin, followers, pool):
    """The followers on one thread: [(t, server epoch, outcome)], finalize's t."""
    sel = selectors.DefaultSelector()
    for i, c in enumerate(followers):
        c.send_query_params(FOLLOW.encode(), [key.encode(), HASH.encode()])
        c.flush()
        sel.register(c.socket, selectors.EVENT_READ, i)
    pids = wait_until_asleep(admin, min(len(followers), pool))
    w = winner.pgconn
    cpu0 = cpu_ns(pids)
    wall0, t0, s0 = time.time(), time.monotonic(), switches()
    w.send_query_params(FINALIZE, [key.encode(), claim_id.encode()])
    w.flush()
    sel.register(w.socket, selectors.EVENT_READ, -1)
    # Only stamp here: parsing an answer would delay the next one's stamp.
    stamp = {}
    while len(stamp) <= len(followers):
        events = sel.select()
        now = time.monotonic()
        for k, _ in events:
            stamp[k.data] = now
            sel.unregister(k.fileobj)
    sel.close()
    switched = switches() - s0
    _, error = result_of(w)
    if error:
        sys.exit(f"growth_wakeup: the finalize failed: {error}")
    out = []
    for i, c in enumerate(followers):
        row, error = result_of(c)
        out.append((stamp[i], float(row[1]) if row else float("nan"),
                    row[0] if row else "error: " + error))
    cpu = cpu_ns(pids)
    return out, stamp[-1], wall0, t0, switched, None if cpu0 is None or cpu is None else cpu - cpu0, pids


def threads_round(key, claim_id, winner, admin, dsn, n, pool):
    """A thread and a new connection per follower, as this script's first
    version measured."""
    out, tids, after, ran = [None] * n, [0] * n, [0] * n, [0] * n
    barrier = threading.Barrier(n + 1)
    direct = pool >= n

    def follower(i):
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            tids[i] = threading.get_native_id()
            barrier.wait()
            row = conn.execute(FOLLOW.replace("$1", "%s").replace("$2", "%s"),
                               (key, HASH)).fetchone()
            out[i] = (time.monotonic(), row[1], row[0])
            after[i] = switches()
            # Its backend exits with the connection: read what it ran now.
            if direct:
                ran[i] = cpu_ns([conn.info.backend_pid])

    threads = [threading.Thread(target=follower, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    pids = wait_until_asleep(admin, min(n, pool))
    cpu0 = cpu_ns(pids)
    before = [switches(tid) for tid in tids]
    wall0, t0 = time.time(), time.monotonic()
    winner.execute(FINALIZE.decode().replace("$1", "%s").replace("$2", "%s"), (key, claim_id))
    fin = time.monotonic()
    for t in threads:
        t.join()
    cpu = (None if None in ran else sum(ran)) if direct else cpu_ns(pids)
    return out, fin, wall0, t0, sum(after) - sum(before), None if cpu0 is None or cpu is None else cpu - cpu0, pids


def one_round(harness, winner, admin, dsn, n, pool, kept):
    """One key, one finalize, as harness drives the followers."""
    before = wake_counts(admin)
    key = "\\x" + hashlib.sha256(os.urandom(16)).hexdigest()
    claim_id = str(winner.execute(
        "SELECT claim_id FROM idem_claim(%s::bytea, %s::bytea, '30 s'::interval)",
        (key, HASH)).fetchone()[0])
    if harness == "threads":
        out, fin, wall0, t0, switched, cpu, pids = threads_round(key, claim_id, winner, admin, dsn, n,
                                                                 pool)
    else:
        followers = kept if harness == "loop" else connect(dsn, n)
        out, fin, wall0, t0, switched, cpu, pids = loop_round(key, claim_id, winner, admin, followers,
                                                              pool)
        if harness != "loop":
            for c in followers:
                c.finish()
    if harness != "loop" and pool >= n:
        wait_until_gone(admin, pids)
    after = wake_counts(admin)
    return ([((t - t0) * 1000, (server - wall0) * 1000, outcome) for t, server, outcome in out],
            (fin - t0) * 1000, after[0] - before[0], after[1] - before[1], switched,
            "" if cpu is None else f"{cpu / 1000 / n:.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--followers", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--harness", nargs="+", default=["loop"], choices=["loop", "fresh", "threads"])
    ap.add_argument("--direct", required=True)
    ap.add_argument("--pooled")
    ap.add_argument("--pool-size", type=int, default=5)
    args = ap.parse_args()
    print("harness,path,followers,round,follower,ms,server_ms,finalize_ms,slept,woken,switches,"
          "cpu_us,outcome")
    paths = [("direct", args.direct, 10 ** 6)]
    if args.pooled:
        paths.append(("pgbouncer", args.pooled, args.pool_size))
    # The loop's connections stay open over the rounds; the cells interleave
    # within each round, so that the machine's drift hits them alike.
    kept = {(name, n): connect(dsn, n) for n in args.followers for name, dsn, _ in paths} \
        if "loop" in args.harness else {}
    with psycopg.connect(args.direct, autocommit=True) as winner, \
            psycopg.connect(args.direct, autocommit=True) as admin:
        for r in range(args.rounds + 1):  # round 0 warms up: not counted
            for n in args.followers:
                for harness in args.harness:
                    for name, dsn, pool in paths:
                        out, fin, slept, woken, switched, cpu = one_round(
                            harness, winner, admin, dsn, n, pool, kept.get((name, n)))
                        if r == 0:
                            continue
                        for i, (ms, server, outcome) in enumerate(out):
                            print(f"{harness},{name},{n},{r},{i},{ms:.3f},{server:.3f},{fin:.3f},"
                                  f"{slept},{woken},{switched},{cpu},{outcome}")
                        sys.stdout.flush()
    for conns in kept.values():
        for c in conns:
            c.finish()


if __name__ == "__main__":
    main()
