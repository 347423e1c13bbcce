"""Against a SQL_ASCII database (what initdb makes when the environment sets
no locale): psycopg returns text columns as bytes there, and the runner
compared b"claimed" with "claimed" and answered every request "failed"
(issue 24 item 12). Both the connections pg_idem opens (client_encoding
UTF8) and connections the application opens without it must work."""

import asyncio
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner, SimplePool
from pg_idem.aio import AsyncRunner, AsyncSimplePool

DB = "idem_py_ascii"


@pytest.fixture(scope="module")
def ascii_dsn(dsn):
    base = dsn.rsplit(" dbname=", 1)[0]
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        c.execute("CREATE DATABASE %s ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" % DB)
    own = base + " dbname=" + DB
    with psycopg.connect(own, autocommit=True) as c:
        assert c.execute("SHOW server_encoding").fetchone()[0] in ("SQL_ASCII", b"SQL_ASCII")
        c.execute("CREATE EXTENSION pg_idem")
        c.execute("CREATE TABLE effects (k text, note text)")
    yield own
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)


class PlainPool:
    """The application's own connections, opened without client_encoding:
    text comes back as bytes on them."""

    def __init__(self, dsn):
        self.dsn = dsn

    def getconn(self):
        return psycopg.connect(self.dsn, autocommit=True)

    def putconn(self, conn):
        conn.close()


def req(k, body=b'{"amount": 5}', target="/ascii"):
    return Request("alice", "POST", target, [k], body)


HEADERS = [("Content-Type", "application/json"), ("Location", "/payments/é")]


@pytest.mark.parametrize("pool_kind", ["SimplePool", "plain"])
def test_claim_replay_mismatch_on_sql_ascii(ascii_dsn, pool_kind):
    pool = SimplePool(ascii_dsn) if pool_kind == "SimplePool" else PlainPool(ascii_dsn)
    if pool_kind == "plain":
        with psycopg.connect(ascii_dsn) as c:
            assert c.execute("SELECT 'x'::text").fetchone()[0] == b"x"  # the trap is real
    r = Runner(pool, Config(follower_wait_budget=1))
    k = str(uuid.uuid4())
    runs = []

    def handler(claim):
        runs.append(claim.generation)
        return Response(201, HEADERS, '{"id": "é"}')
    first = r.run(req(k), handler)
    assert first.outcome == "won_completed" and first.response.status == 201, first
    again = r.run(req(k), handler)
    assert again.replayed and again.outcome == "replay" and again.response.status == 201
    assert again.response.body == '{"id": "é"}'.encode()
    assert again.response.header("location") == "/payments/é"
    mismatch = r.run(req(k, b"other"), handler)
    assert mismatch.outcome == "conflict" and mismatch.response.status == 422
    assert len(runs) == 1


@pytest.mark.parametrize("mode", ["run_fenced", "run_in_transaction"])
def test_exactly_once_modes_on_sql_ascii(ascii_dsn, mode):
    r = Runner(PlainPool(ascii_dsn), Config(follower_wait_budget=1))
    k = str(uuid.uuid4())
    runs = []

    def handler(tx, claim):
        runs.append(1)
        tx.execute("INSERT INTO effects VALUES (%s, %s)", (k, "é"))
        return Response(201, HEADERS, b"paid")
    first = getattr(r, mode)(req(k, target="/ascii/" + mode), handler)
    assert first.outcome == "won_completed", first
    again = getattr(r, mode)(req(k, target="/ascii/" + mode), handler)
    assert again.replayed and again.response.body == b"paid"
    assert getattr(r, mode)(req(k, b"other", "/ascii/" + mode), handler).response.status == 422
    assert len(runs) == 1


def test_async_and_asgi_on_sql_ascii(ascii_dsn):
    async def main():
        pool = AsyncSimplePool(ascii_dsn)
        r = AsyncRunner(pool, Config(follower_wait_budget=1))
        k = str(uuid.uuid4())
        runs = []

        async def handler(claim):
            runs.append(1)
            return Response(201, HEADERS, b"async")
        out = [await r.run(req(k, target="/ascii/async"), handler) for _ in range(2)]
        out.append(await r.run(req(k, b"other", "/ascii/async"), handler))
        await pool.close()
        return runs, out
    runs, (first, again, mismatch) = asyncio.run(main())
    assert first.outcome == "won_completed" and again.replayed and mismatch.response.status == 422
    assert len(runs) == 1

    fastapi = pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from pg_idem.asgi import IdempotencyMiddleware, header
    app = fastapi.FastAPI()
    app.add_middleware(IdempotencyMiddleware, dsn=ascii_dsn, principal=header("x-user"))
    made = []

    @app.post("/orders")
    async def create(order: dict):
        made.append(order)
        return fastapi.responses.JSONResponse({"order": len(made)}, status_code=201)
    k = str(uuid.uuid4())
    with TestClient(app) as client:
        h = {"Idempotency-Key": k, "X-User": "u1"}
        a = client.post("/orders", json={"sku": "a"}, headers=h)
        b = client.post("/orders", json={"sku": "a"}, headers=h)
        c = client.post("/orders", json={"sku": "b"}, headers=h)
    assert a.status_code == 201 and b.status_code == 201 and b.headers["idempotent-replayed"] == "true"
    assert c.status_code == 422 and len(made) == 1
