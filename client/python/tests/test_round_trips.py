"""Round trips per request in each mode, counted on the wire: the runner's
connections go through client/conformance/flight_relay.py, which counts
the flights (what a client sends before it waits for the server). A count,
not a time: docs/benchmarks.md's round-trip table is these numbers."""

import asyncio
import os
import sys
import uuid

import psycopg
import psycopg.conninfo
import pytest

from pg_idem import Config, Request, Response, Runner, SimplePool, _ops, cache_key
from pg_idem.aio import AsyncRunner, AsyncSimplePool

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "conformance"))
from flight_relay import Relay  # noqa: E402

# A lease far beyond the test: no renewal can add a flight.
CFG = Config(lease=300)
# Nothing prepared, so that the counts do not depend on how often a
# statement ran before: psycopg prepares a statement on its fifth use (a
# flight of its own, once per connection) and forgets them all after any
# ROLLBACK (a DEALLOCATE ALL before the next statement). With prepared
# statements a flight carries Bind and Execute instead of Parse too: the
# same flights.
UNPREPARED = {"prepare_threshold": None}


@pytest.fixture
def relayed(dsn):
    """(dsn through the relay, the relay)."""
    d = psycopg.conninfo.conninfo_to_dict(dsn)
    relay = Relay(d.get("host") or "/var/run/postgresql", d.get("port") or 5432)
    through = dict(d, host="127.0.0.1", port=str(relay.port))
    yield psycopg.conninfo.make_conninfo(**through), relay
    relay.close()


def req(target):
    return Request("alice", "POST", target, [str(uuid.uuid4())], b"{}")


def ok(claim):
    return Response(201, [], b"made")


def tx_ok(tx, claim):
    tx.execute("INSERT INTO effects VALUES (%s, %s, 'round trips')", (claim.claim_id, claim.generation))
    return Response(201, [], b"made")


class Counter:
    """The flights since the last take(), and what each carried."""

    def __init__(self, relay):
        self.relay, self.seen = relay, relay.flights()

    def take(self):
        log = self.relay.log()[self.seen:]
        self.seen += len(log)
        return len(log), log


def measure(runner, relay):
    """{what: (flights, log)} of a new key and a replay in each mode; one
    request of each first, so that opening connections and the first-use
    check are not counted."""
    modes = {"lease": lambda r: runner.run(r, ok),
             "fenced": lambda r: runner.run_fenced(r, tx_ok),
             "in_transaction": lambda r: runner.run_in_transaction(r, tx_ok)}
    for name, run in modes.items():
        assert run(req("/warm-" + name)).outcome == "won_completed"
    out, count = {}, Counter(relay)
    for name, run in modes.items():
        r = req("/" + name)
        assert run(r).outcome == "won_completed"
        out[name] = count.take()
        assert run(r).replayed
        out[name + " replay"] = count.take()
    return out


def statements(log):
    """A flight log in short: each statement's first word or pg_idem call."""
    def short(sql):
        for fn in ("idem_claim", "idem_begin", "idem_finalize", "idem_release", "idem_fail", "idem_lookup"):
            if fn in sql:
                return fn
        return sql.split()[0].upper() if sql.strip() else sql
    return [[short(s) for s in flight] for flight in log]


# The handler's INSERT is one flight of its own in the fenced and
# in-transaction modes (the application's, not the runner's).
EXPECTED = {
    "lease": [["idem_claim"], ["idem_finalize"]],
    "lease replay": [["idem_claim"]],
    "fenced": [["idem_claim"], ["BEGIN"], ["INSERT"], ["idem_finalize", "COMMIT"]],
    "fenced replay": [["idem_claim"]],
    "in_transaction": [["BEGIN", "idem_begin", "SAVEPOINT"], ["INSERT"], ["idem_finalize", "COMMIT"]],
    # The replay is read in the transaction it would have run in, then rolled back.
    "in_transaction replay": [["BEGIN", "idem_begin", "SAVEPOINT"], ["ROLLBACK"]],
}


def check(got, expected):
    for what, flights in expected.items():
        n, log = got[what]
        assert statements(log) == flights, "%s: %d flights %r" % (what, n, log)
        assert n == len(flights)


def test_flights_per_request_in_each_mode(relayed):
    dsn, relay = relayed
    pool = SimplePool(dsn, **UNPREPARED)
    try:
        check(measure(Runner(pool, CFG), relay), EXPECTED)
    finally:
        pool.close()


def test_flights_per_request_with_the_asyncio_runner(relayed):
    dsn, relay = relayed

    async def tx_ok_async(tx, claim):
        await tx.execute("INSERT INTO effects VALUES (%s, %s, 'round trips')", (claim.claim_id, claim.generation))
        return Response(201, [], b"made")

    async def main():
        pool = AsyncSimplePool(dsn, **UNPREPARED)
        runner = AsyncRunner(pool, CFG)
        modes = {"lease": lambda r: runner.run(r, ok),
                 "fenced": lambda r: runner.run_fenced(r, tx_ok_async),
                 "in_transaction": lambda r: runner.run_in_transaction(r, tx_ok_async)}
        for name, run in modes.items():
            assert (await run(req("/warm-" + name))).outcome == "won_completed"
        out, count = {}, Counter(relay)
        for name, run in modes.items():
            r = req("/" + name)
            assert (await run(r)).outcome == "won_completed"
            out[name] = count.take()
            assert (await run(r)).replayed
            out[name + " replay"] = count.take()
        await pool.close()
        return out
    check(asyncio.run(main()), EXPECTED)


def test_without_pipeline_mode_each_statement_is_a_flight(relayed, monkeypatch):
    # What a psycopg on libpq 13 does: the same statements, one by one.
    monkeypatch.setattr(_ops, "PIPELINE", False)
    dsn, relay = relayed
    pool = SimplePool(dsn, **UNPREPARED)
    try:
        got = measure(Runner(pool, CFG), relay)
    finally:
        pool.close()
    one_by_one = {what: [[s] for flight in flights for s in flight] for what, flights in EXPECTED.items()}
    check(got, one_by_one)


def test_a_failed_store_in_the_commit_flight_keeps_the_cooldown(relayed, db):
    # The finalize fails in the flight with COMMIT: COMMIT is skipped, the
    # handler's writes are rolled back and the key is failed with its
    # cooldown, in one more flight; the caller is told the outcome is unknown.
    dsn, relay = relayed
    pool = SimplePool(dsn, **UNPREPARED)
    r = req("/refused")
    try:
        runner = Runner(pool, Config(lease=300, failure_cooldown=60))
        runner.run_in_transaction(req("/warm"), tx_ok)
        count = Counter(relay)
        note = "refused " + str(uuid.uuid4())

        def handler(tx, claim):
            tx.execute("INSERT INTO effects VALUES (%s, %s, %s)", (claim.claim_id, claim.generation, note))
            return Response(201, [("Content-Type", "text/plain")], b"x")
        # Headers the server cannot read as JSON fail the finalize itself.
        runner.engine.allow.to_json = lambda headers: '{"broken": '
        res = runner.run_in_transaction(r, handler)
        n, log = count.take()
    finally:
        pool.close()
    assert res.outcome == "failed" and res.response.status == 503
    assert "finalize_error" in res.events
    assert statements(log)[-2:] == [["idem_finalize", "COMMIT"], ["ROLLBACK", "idem_fail", "COMMIT"]], log
    assert db.execute("SELECT count(*) FROM effects WHERE note = %s", (note,)).fetchone()[0] == 0
    assert db.execute("SELECT state FROM idem_keys WHERE cache_key = %s",
                      (cache_key(r.principal, r.method, r.target, r.keys[0]),)).fetchone()[0] == "failed"


def test_a_flight_whose_prepared_statement_is_gone_prepares_it_again(dsn):
    # psycopg sends DEALLOCATE ALL after a ROLLBACK it sees, a session
    # pooler DISCARD ALL: the next first flight finds its statement gone
    # (26000), is rolled back and sent again, and the request runs once.
    pool = SimplePool(dsn, max_size=1)
    runner = Runner(pool, CFG)
    runs = []

    def handler(tx, claim):
        runs.append(claim.claim_id)
        return Response(201, [], b"made")
    try:
        assert runner.run_in_transaction(req("/prepared"), handler).outcome == "won_completed"
        conn = pool.getconn()
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pg_idem_flight_%'"
                            ).fetchone()[0] == 1
        conn.execute("DEALLOCATE ALL")
        pool.putconn(conn)
        res = runner.run_in_transaction(req("/prepared"), handler)
        assert res.outcome == "won_completed", res.error
        assert len(runs) == 2
    finally:
        pool.close()


def test_a_replay_leaves_the_prepared_statements_in_place(relayed):
    # Prepared statements (psycopg's and the flights') outlive a ROLLBACK,
    # but psycopg forgets its own and sends DEALLOCATE ALL after one it
    # sees: the runner's rollbacks in in-transaction mode go in flights of
    # their own, so that after a replay a request takes its three flights
    # (two and the handler's INSERT), no DEALLOCATE ALL and no second try.
    dsn, relay = relayed
    pool = SimplePool(dsn, max_size=1)
    runner = Runner(pool, CFG)
    try:
        for _ in range(6):  # psycopg prepares the handler's INSERT on its fifth use
            assert runner.run_in_transaction(req("/kept"), tx_ok).outcome == "won_completed"
        r = req("/kept")
        assert runner.run_in_transaction(r, tx_ok).outcome == "won_completed"
        assert runner.run_in_transaction(r, tx_ok).replayed
        count = Counter(relay)
        for _ in range(2):
            assert runner.run_in_transaction(req("/kept"), tx_ok).outcome == "won_completed"
            n, log = count.take()
            assert n == 3, log
            assert not any("DEALLOCATE" in s or s == "ROLLBACK" for f in log for s in f), log
    finally:
        pool.close()
