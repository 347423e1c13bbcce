#!/usr/bin/python3
"""Follower wake-up for make bench's growth section (tests/bench/growth.sh).

One winner claims a key; N followers, each on its own connection, call
idem_claim with max_wait and wait inside the database; once every follower
that can reach a server is waiting, the winner finalizes.  What is measured
is the time from the winner sending its finalize (autocommit) to each
follower's answer.
Through PgBouncer in transaction mode (pool 5) only 5 followers hold a
server connection at once: the rest queue in the pooler, and their time
includes the queue.  Prints CSV: path,followers,round,follower,ms,outcome.
"""
import argparse
import hashlib
import os
import sys
import threading
import time

import psycopg

HASH = bytes.fromhex("5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9")


def follower(dsn, key, barrier, out, index):
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        barrier.wait()
        row = conn.execute(
            "SELECT outcome FROM idem_claim(%s, %s, '30 s'::interval, '60 s'::interval)",
            (key, HASH)).fetchone()
        out[index] = (time.monotonic(), row[0])


def waiting_backends(admin, key):
    # The followers' backends inside the claim's wait (the winner's own
    # session is idle: it claimed and committed).
    return admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        " AND query LIKE '%%idem_claim%%' AND pid <> pg_backend_pid()").fetchone()[0]


def one_round(path, dsn, direct, followers, round_no, pool):
    key = hashlib.sha256(os.urandom(16)).digest()
    with psycopg.connect(direct, autocommit=True) as winner, \
            psycopg.connect(direct, autocommit=True) as admin:
        claim_id = winner.execute(
            "SELECT claim_id FROM idem_claim(%s, %s, '30 s'::interval)", (key, HASH)).fetchone()[0]
        out = [None] * followers
        barrier = threading.Barrier(followers + 1)
        threads = [threading.Thread(target=follower, args=(dsn, key, barrier, out, i))
                   for i in range(followers)]
        for t in threads:
            t.start()
        barrier.wait()
        expected = min(followers, pool)
        deadline = time.monotonic() + 60
        while waiting_backends(admin, key) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        winner.execute("SELECT idem_finalize(%s, %s, 200, '{}'::jsonb, 'ok'::bytea)",
                       (key, claim_id))
        for t in threads:
            t.join()
    for i, (t, outcome) in enumerate(out):
        print(f"{path},{followers},{round_no},{i},{(t - t0) * 1000:.2f},{outcome}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--followers", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--direct", required=True)
    ap.add_argument("--pooled")
    ap.add_argument("--pool-size", type=int, default=5)
    args = ap.parse_args()
    print("path,followers,round,follower,ms,outcome")
    paths = [("direct", args.direct, 10 ** 6)]
    if args.pooled:
        paths.append(("pgbouncer", args.pooled, args.pool_size))
    for r in range(1, args.rounds + 1):
        for n in args.followers:
            for name, dsn, pool in paths:
                one_round(name, dsn, args.direct, n, r, pool)


if __name__ == "__main__":
    main()
