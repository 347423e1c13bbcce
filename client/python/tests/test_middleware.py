"""The ASGI middleware in a FastAPI app and the WSGI middleware in a Flask app,
each added with one line, against the real server."""

import json
import uuid

import pytest

from pg_idem import Config


def test_fastapi_app_becomes_idempotent_with_one_line(dsn):
    fastapi = pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from pg_idem.asgi import IdempotencyMiddleware, header

    app = fastapi.FastAPI()
    app.add_middleware(IdempotencyMiddleware, dsn=dsn, principal=header("x-user"))  # the one line
    runs = []

    @app.post("/orders")
    async def create(order: dict):
        runs.append(order)
        return fastapi.responses.JSONResponse({"order": len(runs), **order}, status_code=201,
                                              headers={"Set-Cookie": "sid=1", "Location": "/orders/1"})

    @app.get("/orders")
    async def listing():
        return {"n": len(runs)}

    k = str(uuid.uuid4())
    with TestClient(app) as client:
        first = client.post("/orders", json={"sku": "a"}, headers={"Idempotency-Key": k, "X-User": "u1"})
        again = client.post("/orders", json={"sku": "a"}, headers={"Idempotency-Key": k, "X-User": "u1"})
        other_user = client.post("/orders", json={"sku": "a"}, headers={"Idempotency-Key": k, "X-User": "u2"})
        mismatch = client.post("/orders", json={"sku": "b"}, headers={"Idempotency-Key": k, "X-User": "u1"})
        unguarded = client.post("/orders", json={"sku": "c"}, headers={"X-User": "u1"})
        get = client.get("/orders")
    assert first.status_code == 201 and first.json() == {"order": 1, "sku": "a"}
    assert first.headers.get("set-cookie") == "sid=1"
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true" and "set-cookie" not in again.headers
    assert again.headers["location"] == "/orders/1"
    assert other_user.json()["order"] == 2
    assert mismatch.status_code == 422 and mismatch.headers["content-type"] == "application/problem+json"
    assert unguarded.status_code == 201
    assert get.json() == {"n": 3} and len(runs) == 3


def test_asgi_repeated_key_fields_get_400(dsn):
    # Starlette's TestClient joins repeated fields; uvicorn hands them over one by one.
    import asyncio

    from pg_idem.asgi import IdempotencyMiddleware

    async def inner(scope, receive, send):
        raise AssertionError("must not run")

    async def main():
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(m):
            sent.append(m)
        mw = IdempotencyMiddleware(inner, dsn=dsn, principal=lambda scope: "svc")
        scope = {"type": "http", "method": "POST", "path": "/x", "raw_path": b"/x", "query_string": b"",
                 "headers": [(b"idempotency-key", b"a"), (b"idempotency-key", b"b")]}
        await mw(scope, receive, send)
        return sent
    sent = asyncio.run(main())
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["type"] == "urn:pg-idem:problem:idempotency-key-invalid"


def test_middleware_needs_a_principal(dsn):
    from pg_idem import asgi, wsgi
    for module in (asgi, wsgi):
        with pytest.raises(TypeError, match="principal"):
            module.IdempotencyMiddleware(lambda *a: None, dsn=dsn)


def test_asgi_fenced_mode_hands_the_transaction_to_the_app(dsn):
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from pg_idem.asgi import CONN, IdempotencyMiddleware, header

    async def pay(request):
        conn = request.scope[CONN]
        claim = request.scope["pg_idem.claim"]
        await conn.execute("INSERT INTO effects VALUES (%s, %s, 'asgi')", (claim.claim_id, claim.generation))
        return PlainTextResponse("paid", status_code=201)

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, dsn=dsn, principal=header("x-user"), mode="fenced",
                       config=Config(follower_wait_budget=1))
    k = str(uuid.uuid4())
    with TestClient(app) as client:
        a = client.post("/pay", content=b"x", headers={"Idempotency-Key": k, "X-User": "u"})
        b = client.post("/pay", content=b"x", headers={"Idempotency-Key": k, "X-User": "u"})
    assert a.status_code == 201 and b.text == "paid" and b.headers["idempotent-replayed"] == "true"


def test_flask_app_becomes_idempotent_with_one_line(dsn):
    flask = pytest.importorskip("flask")
    from pg_idem.wsgi import IdempotencyMiddleware, header

    app = flask.Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, dsn=dsn, principal=header("X-User"))  # the one line
    runs = []

    @app.post("/charges")
    def charge():
        runs.append(flask.request.get_json())
        return flask.jsonify(charge=len(runs)), 201

    @app.post("/fail")
    def fail():
        runs.append("fail")
        return "down", 503

    client = app.test_client()
    k = str(uuid.uuid4())
    h = {"Idempotency-Key": k, "X-User": "u"}
    first = client.post("/charges", json={"amount": 5}, headers=h)
    again = client.post("/charges", json={"amount": 5}, headers=h)
    mismatch = client.post("/charges", json={"amount": 6}, headers=h)
    f1 = client.post("/fail", headers={"Idempotency-Key": k + "f", "X-User": "u"})
    f2 = client.post("/fail", headers={"Idempotency-Key": k + "f", "X-User": "u"})
    long_key = client.post("/charges", json={"amount": 5}, headers={"Idempotency-Key": "x" * 256, "X-User": "u"})
    assert first.status_code == 201 and first.get_json() == {"charge": 1}
    assert again.status_code == 201 and again.get_json() == {"charge": 1}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert mismatch.status_code == 422
    assert f1.status_code == 503 and f2.status_code == 503 and "Retry-After" in f2.headers
    assert long_key.status_code == 400
    assert runs == [{"amount": 5}, "fail"]
