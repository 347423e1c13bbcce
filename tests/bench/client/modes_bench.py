"""A new-key request in each of the Python runner's modes, at CLIENTS
threads, interleaved in rounds so that a loaded machine weighs on each
alike (client/cpp/bench/modes_bench.cpp's cells, for the Python client):
lease mode (run), run_fenced, run_in_transaction (two flights, psycopg's
pipeline mode) and run_in_transaction with pipeline mode off (each
statement its own round trip, as before 0.5.0 and on libpq < 14). The
handler writes one row in every mode: in its transaction in the
exactly-once modes, autocommitted on a connection of its own in lease mode.

    python3 tests/bench/client/modes_bench.py CONNINFO [CLIENTS=4] [SECONDS_PER_CELL=2] [ROUNDS=3]

Prints requests/s per mode and the ratio to lease mode, within one run.
The database needs the extension; the bench creates its table bench_effects.
"""

import os
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "client", "python"))

import psycopg  # noqa: E402

from pg_idem import Config, Request, Response, Runner, SimplePool, _ops  # noqa: E402

MODES = ("lease", "fenced", "in_transaction", "in_transaction one by one")
INSERT = "INSERT INTO bench_effects VALUES (%s, %s)"


def cell(runner, mode, clients, seconds, dsn):
    """Requests/s of one mode: CLIENTS threads, each a new key per request."""
    _ops.PIPELINE = mode != "in_transaction one by one" and psycopg.Pipeline.is_supported()
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(i):
        own = psycopg.connect(dsn, autocommit=True) if mode == "lease" else None

        def lease(claim):
            own.execute(INSERT, (claim.claim_id, claim.generation))
            return Response(201, [], b"made")

        def in_tx(tx, claim):
            tx.execute(INSERT, (claim.claim_id, claim.generation))
            return Response(201, [], b"made")
        while time.monotonic() < stop:
            r = Request("bench", "POST", "/modes", [str(uuid.uuid4())], b"{}")
            if mode == "lease":
                res = runner.run(r, lease)
            elif mode == "fenced":
                res = runner.run_fenced(r, in_tx)
            else:
                res = runner.run_in_transaction(r, in_tx)
            if res.outcome != "won_completed":
                raise SystemExit("%s: %s (%s)" % (mode, res.outcome, res.error))
            done[i] += 1
        if own is not None:
            own.close()
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    dsn = argv[1]
    clients = int(argv[2]) if len(argv) > 2 else 4
    seconds = float(argv[3]) if len(argv) > 3 else 2.0
    rounds = int(argv[4]) if len(argv) > 4 else 3
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_effects (claim_id uuid, generation bigint)")
        sc = c.execute("SELECT current_setting('synchronous_commit'), current_setting('fsync')").fetchone()
    pool = SimplePool(dsn, max_size=2 * clients)
    runner = Runner(pool, Config())
    total = {m: 0.0 for m in MODES}
    for rnd in range(rounds):
        for m in MODES:
            rate = cell(runner, m, clients, seconds, dsn)
            total[m] += rate
            print("round %d  %-26s %8.0f requests/s" % (rnd + 1, m, rate), flush=True)
    pool.close()
    print("synchronous_commit = %s, fsync = %s, %d clients, %d rounds of %g s cells" % (sc[0], sc[1], clients,
                                                                                          rounds, seconds))
    lease = total["lease"] / rounds
    for m in MODES:
        avg = total[m] / rounds
        print("%-26s %8.0f requests/s  %.2f x lease" % (m, avg, avg / lease))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
