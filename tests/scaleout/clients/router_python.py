"""The Python client through the PL/Proxy router (tests/scaleout/t/030_router_clients.pl).

    router_python.py ROUTER_DSN KEY

Runs the first-use check, then one lease-mode request twice with the key
KEY, and prints what happened, one fact a line, for the TAP test to
compare; a check that refuses is printed too (the test expects it for a
role without EXECUTE)."""

import sys

from pg_idem import Config, Request, Response, Runner, SimplePool, StoreMisconfigured


def main(dsn, key):
    pool = SimplePool(dsn)
    try:
        runner = Runner(pool, Config(lease=5, follower_wait_budget=2))
        try:
            runner.check()
        except StoreMisconfigured as e:
            print("check refused: %s" % e)
            return
        print("check passed")
        runs = []

        def handler(claim):
            runs.append(claim.generation)
            return Response(201, [("Content-Type", "text/plain")], b"paid")

        req = Request("alice", "POST", "/payments", [key], b'{"amount": 1}')
        for name in ("first", "again"):
            r = runner.run(req, handler)
            print("%s %s %s %s" % (name, r.response.status, r.outcome, r.response.body.decode()))
        print("runs %d" % len(runs))
    finally:
        pool.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
