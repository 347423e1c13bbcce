"""A client's own limits (issue 31), as the three clients agree on them by
client/conformance/protocol.json (protocol.toml [client.missing_principal],
[client.pool], [client.startup]), against the real server:

* a guarded request without a principal is refused, 401 principal-missing,
  never keyed on "" nor run unguarded (the duplicate charged twice);
* an exhausted pool is answered 503 connection-pool-exhausted, counted and
  logged with its fix, never "the server cannot be reached"; duplicates
  waiting for a slow first request keep to their share of the pool, so
  first requests on other keys still run (30 of them once took the pool of
  10 for their whole wait: 503s, and 4.5 s for the others);
* the start-up check refuses to start for a role, database or socket that
  does not exist, and waits for a server that comes up meanwhile.

No test waits a fixed time: handlers block on events, and the tests wait
for states (a counter, a log line) with generous deadlines."""

import asyncio
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import (Config, PoolExhausted, Request, Response, Runner, SimplePool, StoreMisconfigured,
                     protocol)
from pg_idem.aio import AsyncRunner

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "conformance"))
from flight_relay import Relay  # noqa: E402

with open(os.path.join(HERE, "..", "..", "conformance", "protocol.json"), encoding="utf-8") as f:
    SPEC = json.load(f)


class Counting:
    """metrics=: the outcomes and events of the runs."""

    def __init__(self):
        self.outcomes, self.events = [], []

    def on_outcome(self, name):
        self.outcomes.append(name)

    def on_event(self, name):
        self.events.append(name)


def wait_for(predicate, what, deadline=60.0):
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("still waiting for " + what)
        time.sleep(0.01)


def assert_problem(response, case, profile="ietf"):
    body = json.loads(response.body)
    assert response.status == case["status"][profile] == body["status"], (response.status, body)
    assert body["type"] == case["type"]
    assert (response.header("Retry-After") is not None) == case["retry_after"]


# ---- a missing principal ----------------------------------------------------------

@pytest.mark.parametrize("case", SPEC["principal_vectors"],
                         ids=lambda c: "%r-%s-%s" % (c["principal"], len(c["keys"]), c.get("problem", c["result"])))
def test_principal_vectors(dsn, case):
    runner = Runner(dsn)
    runs = []
    tag = uuid.uuid4().hex
    keys = [k + tag for k in case["keys"]]
    r = runner.run(Request(case["principal"], "POST", "/principal", keys, b"{}", case["key_required"]),
                   lambda claim: runs.append(claim) or Response(201, [], b"ran"))
    assert r.handler_ran == case["handler_ran"] and len(runs) == int(case["handler_ran"])
    assert r.outcome == case["result"]
    if "problem" in case:
        assert_problem(r.response, case)


def test_a_principal_of_none_is_missing_too(dsn):
    r = Runner(dsn).run(Request(None, "POST", "/principal", [str(uuid.uuid4())], b"{}"),
                        lambda claim: Response(201, [], b"ran"))
    assert r.response.status == 401 and not r.handler_ran


def test_flask_refuses_a_guarded_request_without_a_principal(dsn):
    flask = pytest.importorskip("flask")
    from pg_idem.wsgi import IdempotencyMiddleware, header

    app = flask.Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, dsn=dsn, principal=header("X-User"))
    runs = []

    @app.post("/charges")
    def charge():
        runs.append(1)
        return "charged", 201

    client = app.test_client()
    k = str(uuid.uuid4())
    a = client.post("/charges", data=b"{}", headers={"Idempotency-Key": k})
    b = client.post("/charges", data=b"{}", headers={"Idempotency-Key": k})
    assert a.status_code == b.status_code == 401 and runs == []
    assert a.get_json()["type"] == "urn:pg-idem:problem:principal-missing"
    # The explicit opt-in of a route without users: one principal for all its callers.
    public = flask.Flask(__name__)
    public.wsgi_app = IdempotencyMiddleware(public.wsgi_app, dsn=dsn, principal=lambda environ: "webhooks")
    public.post("/charges")(charge)
    c = public.test_client()
    assert [c.post("/charges", data=b"{}", headers={"Idempotency-Key": k}).status_code for _ in range(2)] == [201] * 2
    assert runs == [1]


# ---- an exhausted pool ------------------------------------------------------------

def test_an_exhausted_pool_is_its_own_answer_and_log_line(dsn, caplog):
    caplog.set_level(logging.ERROR, logger="pg_idem")
    case = SPEC["pool_exhausted"]
    pool = SimplePool(dsn, max_size=1, timeout=0.2)
    metrics, reports = Counting(), []
    runner = Runner(pool, metrics=metrics, on_error=reports.append)
    held = pool.getconn()  # the application's own query holds the only connection
    try:
        runs = []
        results = [runner.run(Request("alice", "POST", "/pool", [str(uuid.uuid4())], b"{}"),
                              lambda claim: runs.append(1) or Response(201, [], b"ran")) for _ in range(2)]
    finally:
        pool.putconn(held)
    assert runs == []
    for r in results:
        assert_problem(r.response, case)
        assert r.outcome == case["result"] and isinstance(r.error, PoolExhausted)
    assert metrics.events.count(case["event"]) == 2 and metrics.outcomes == [case["result"]] * 2
    lines = [r.getMessage() for r in caplog.records if r.name == "pg_idem"]
    assert len(lines) == 1, lines  # once per cause
    assert "connection pool exhausted" in lines[0] and protocol.POOL_EXHAUSTED_FIX in lines[0]
    assert "max_size 1" in lines[0] and "cannot be reached" not in lines[0]
    assert "cannot be reached" not in reports[0].fix and reports[0].sqlstate is None
    # The pool is fine again: the same runner serves.
    assert runner.run(Request("alice", "POST", "/pool", [str(uuid.uuid4())], b"{}"),
                      lambda claim: Response(201, [], b"ran")).response.status == 201
    pool.close()


def test_psycopg_pools_timeout_is_an_exhausted_pool_too(dsn):
    psycopg_pool = pytest.importorskip("psycopg_pool")
    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=1, timeout=0.2, kwargs={"autocommit": True}) as pool:
        pool.wait(60)  # the pool's one connection opened (the 0.2 s is the exhausted pool's wait, not a connect's)
        runner = Runner(pool)
        with pool.connection():
            r = runner.run(Request("alice", "POST", "/pool", [str(uuid.uuid4())], b"{}"),
                           lambda claim: Response(201, [], b"ran"))
    assert_problem(r.response, SPEC["pool_exhausted"])
    assert not r.handler_ran


def test_duplicates_of_a_slow_request_leave_the_pool_to_first_requests(dsn):
    """Issue 31 as a new user met it: the middleware's default pool (10), a
    slow handler, 30 duplicates. The handler blocks until released; while
    all 30 wait for it, five first requests on other keys run: before,
    the duplicates held every connection for their whole wait and those
    five were answered 503 "store unavailable" after the pool's 5 s."""
    fastapi = pytest.importorskip("fastapi")
    import httpx

    from pg_idem.asgi import IdempotencyMiddleware, header

    metrics = Counting()
    app_name = "idem_storm_" + uuid.uuid4().hex[:8]
    app = fastapi.FastAPI()
    app.add_middleware(IdempotencyMiddleware, dsn=dsn + " application_name=" + app_name, principal=header("x-user"),
                       metrics=metrics, config=Config(follower_wait_budget=120))
    runs = []

    async def main():
        started, release = asyncio.Event(), asyncio.Event()

        @app.post("/pay")
        async def pay(body: dict):
            runs.append(body["n"])
            if body["n"] == 0:
                started.set()
                await release.wait()
            return {"paid": body["n"]}

        middleware = None
        k = str(uuid.uuid4())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=300) as cl:
            def post(key, n):
                return cl.post("/pay", json={"n": n}, headers={"Idempotency-Key": key, "X-User": "u"})
            first = asyncio.ensure_future(post(k, 0))
            await asyncio.wait_for(started.wait(), 60)
            dups = [asyncio.ensure_future(post(k, 0)) for _ in range(30)]
            # Duplicates wait in the server: at least half the pool's worth
            # (the old client: all but the winner's, for their whole wait).
            end = time.monotonic() + 60
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
                while True:
                    cur = await watch.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                              "AND state = 'active' AND query LIKE '%%idem_claim%%'", (app_name,))
                    if (await cur.fetchone())[0] >= 5:
                        break
                    assert time.monotonic() < end, "the duplicates never waited in the server"
                    await asyncio.sleep(0.01)
            middleware = app.middleware_stack
            while not isinstance(middleware, IdempotencyMiddleware):
                middleware = middleware.app
            others = await asyncio.gather(*(post(str(uuid.uuid4()), n) for n in range(1, 6)))
            still_blocked = not release.is_set() and not first.done()
            held = dict(getattr(middleware.runner.engine, "_held", {"duplicates": None}))
            release.set()
            return still_blocked, held, others, await first, await asyncio.gather(*dups)

    still_blocked, held, others, first, dups = asyncio.run(main())
    assert still_blocked
    assert [r.status_code for r in others] == [200] * 5, [r.text for r in others]
    assert held["duplicates"] <= 5, held  # their share: half the pool
    assert first.status_code == 200 and {r.status_code for r in dups} == {200}
    assert all(r.headers.get("idempotent-replayed") == "true" for r in dups)
    assert sorted(runs) == [0, 1, 2, 3, 4, 5]
    assert "pool_exhausted" not in metrics.events


# ---- start-up ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def roles(dsn):
    """A database without the extension and a role without idem_client."""
    base = dsn.rsplit(" dbname=", 1)[0]
    tag = uuid.uuid4().hex[:8]
    db, role = "idem_py_bare_" + tag, "idem_py_norights_" + tag
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute("CREATE DATABASE %s" % db)
        c.execute("CREATE ROLE %s LOGIN" % role)
    yield {"bare": "%s dbname=%s" % (base, db), "norights": "%s user=%s" % (dsn, role), "base": base}
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db)
        c.execute("DROP ROLE IF EXISTS %s" % role)


def refusals(roles, dsn):
    missing_dir = os.path.join(tempfile.gettempdir(), "pg_idem-no-such-dir-" + uuid.uuid4().hex)
    return [
        (dsn + " user=idem_no_such_role", r'role "idem_no_such_role" does not exist.*check the dsn'),
        (roles["base"] + " dbname=idem_no_such_db", r'database "idem_no_such_db" does not exist'),
        (roles["bare"], r"not installed in the database idem_py_bare_.*CREATE EXTENSION"),
        (roles["norights"], r"may not execute .*GRANT idem_client"),
        ("host=%s port=5432 dbname=x" % missing_dir,
         r"no server answered at socket \"%s/.s.PGSQL.5432\" within 0.3 s.*check the dsn" % missing_dir),
    ]


def test_start_up_refuses_what_cannot_serve(dsn, roles):
    for conninfo, message in refusals(roles, dsn):
        with pytest.raises(StoreMisconfigured, match=message):
            Runner(conninfo).check(wait=0.3)
        with pytest.raises(StoreMisconfigured, match=message):
            asyncio.run(AsyncRunner(conninfo).check(wait=0.3))


def test_the_middlewares_stop_the_start(dsn, roles):
    fastapi = pytest.importorskip("fastapi")
    flask = pytest.importorskip("flask")
    from starlette.testclient import TestClient

    from pg_idem import asgi, wsgi
    for conninfo, message in refusals(roles, dsn):
        app = fastapi.FastAPI()
        app.add_middleware(asgi.IdempotencyMiddleware, dsn=conninfo, principal=asgi.header("x-user"),
                           startup_wait=0.3)
        with pytest.raises(BaseException, match=message):
            with TestClient(app):
                pass
        with pytest.raises(StoreMisconfigured, match=message):
            wsgi.IdempotencyMiddleware(flask.Flask(__name__).wsgi_app, dsn=conninfo,
                                       principal=wsgi.header("X-User"), startup_wait=0.3)


def test_start_up_waits_for_a_server_that_comes_up(dsn):
    """Nothing listens at the address yet: the check says it waits, and
    passes once the server is there (a relay opened after that line)."""
    params = dict(p.split("=", 1) for p in dsn.split())
    relay = Relay(params["host"], params["port"], opened=False)
    waiting = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "waiting up to" in record.getMessage():
                waiting.set()
    handler = Seen()
    logging.getLogger("pg_idem").addHandler(handler)
    outcome = []
    runner = Runner("host=127.0.0.1 port=%d dbname=%s user=%s" % (relay.port, params["dbname"], params["user"]))
    t = threading.Thread(target=lambda: (runner.check(wait=120), outcome.append("ok")))
    try:
        t.start()
        assert waiting.wait(60)
        relay.open()
        t.join(120)
    finally:
        logging.getLogger("pg_idem").removeHandler(handler)
        relay.close()
    assert outcome == ["ok"]
