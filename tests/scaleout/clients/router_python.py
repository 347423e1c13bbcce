"""The Python client through the PL/Proxy router (tests/scaleout/t/030_router_clients.pl).

    router_python.py ROUTER_DSN KEY

Runs the first-use check, then one lease-mode request twice with the key
KEY, then a fenced and an in-transaction request (keys KEY-fenced and
KEY-in-transaction), and prints what happened, one fact a line, for the
TAP test to compare; a check that refuses is printed too (the test expects
it for a role without EXECUTE)."""

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
        # The modes whose point is one transaction are refused, before any claim.
        for label, mode in (("fenced", "run_fenced"), ("in-transaction", "run_in_transaction")):
            ran = []
            r = getattr(runner, mode)(Request("alice", "POST", "/payments", ["%s-%s" % (key, label)], b"{}"),
                                      lambda conn, claim: ran.append(1) or Response(201, [], b""))
            print("%s %s %s ran %d: %s" % (label, r.response.status, r.outcome, len(ran), r.error))
    finally:
        pool.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
