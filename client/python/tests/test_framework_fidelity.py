"""Framework fidelity and key hygiene (issue 22): a malformed body gets what
the framework answers without the middleware, and the corrected retry with
the same key runs (validation failures are not stored by default, as
Stripe); a missing principal never becomes a shared actor "" (nor runs
unguarded: issue 31); a namespace
keeps two services on one role and route apart; a fingerprint hook makes
{"amount": 5} and {"amount":5} one request."""

import json
import logging
import uuid

import pytest

from pg_idem import Config, ConfigError, Request, Response, Runner
from pg_idem.fingerprint import canonical_json, json_fields


def fastapi_app(dsn, runs, **options):
    fastapi = pytest.importorskip("fastapi")
    import pydantic

    from pg_idem.asgi import IdempotencyMiddleware, header

    class Payment(pydantic.BaseModel):
        amount: int

    app = fastapi.FastAPI()
    app.add_middleware(IdempotencyMiddleware, dsn=dsn, principal=header("x-user"), **options)

    @app.post("/payments", status_code=201)
    async def pay(p: Payment):
        runs.append(p.amount)
        return {"paid": p.amount, "run": len(runs)}
    return app


def test_a_malformed_body_gets_the_frameworks_answer_and_the_retry_runs(dsn):
    from starlette.testclient import TestClient

    runs = []
    k = str(uuid.uuid4())
    h = {"Idempotency-Key": k, "X-User": "u1", "Content-Type": "application/json"}
    with TestClient(fastapi_app(dsn, runs)) as client:
        bad = client.post("/payments", content=b'{"amount": ', headers=h)
        fixed = client.post("/payments", content=b'{"amount": 5}', headers=h)
        again = client.post("/payments", content=b'{"amount": 5}', headers=h)
    # What FastAPI answers without the middleware: its own 422 and body.
    fastapi = pytest.importorskip("fastapi")
    plain = fastapi.FastAPI()

    @plain.post("/payments", status_code=201)
    async def pay(p: dict):
        return p
    with TestClient(plain) as c:
        expected = c.post("/payments", content=b'{"amount": ', headers=h)
    assert bad.status_code == expected.status_code == 422
    assert bad.json()["detail"][0]["type"] == expected.json()["detail"][0]["type"]
    assert fixed.status_code == 201 and runs == [5]  # not "key reused": the 422 was not stored
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"


def test_client_errors_store_keeps_the_protocols_table(dsn):
    from starlette.testclient import TestClient

    runs = []
    k = str(uuid.uuid4())
    h = {"Idempotency-Key": k, "X-User": "u1", "Content-Type": "application/json"}
    with TestClient(fastapi_app(dsn, runs, client_errors="store")) as client:
        bad = client.post("/payments", content=b'{"amount": "x"}', headers=h)
        same = client.post("/payments", content=b'{"amount": "x"}', headers=h)
    assert bad.status_code == 422 and same.status_code == 422
    assert same.headers["idempotent-replayed"] == "true"


def test_a_missing_principal_is_never_the_shared_actor(dsn, caplog):
    """Nor run unguarded (issue 31: the duplicate charged twice): 401
    principal-missing, the app not run, one warning saying why."""
    from starlette.testclient import TestClient

    caplog.set_level(logging.WARNING, logger="pg_idem")
    runs = []
    k = str(uuid.uuid4())
    with TestClient(fastapi_app(dsn, runs)) as client:
        a = client.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": k})
        b = client.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": k})
        no_key = client.post("/payments", json={"amount": 2})
    assert a.status_code == b.status_code == 401 and runs == [2], (a.text, runs)
    assert a.json()["type"] == "urn:pg-idem:problem:principal-missing"
    assert "idempotent-replayed" not in b.headers and no_key.status_code == 201
    warnings = [r for r in caplog.records if r.name == "pg_idem" and "no principal" in r.getMessage()]
    assert len(warnings) == 1


def test_a_namespace_keeps_two_services_apart(dsn):
    from starlette.testclient import TestClient

    k = str(uuid.uuid4())
    h = {"Idempotency-Key": k, "X-User": "u1"}
    runs_a, runs_b = [], []
    with TestClient(fastapi_app(dsn, runs_a, namespace="payments")) as a, \
            TestClient(fastapi_app(dsn, runs_b, namespace="refunds")) as b:
        ra = a.post("/payments", json={"amount": 5}, headers=h)
        rb = b.post("/payments", json={"amount": 5}, headers=h)
    assert ra.status_code == rb.status_code == 201 and runs_a == [5] and runs_b == [5]
    assert "idempotent-replayed" not in rb.headers
    with pytest.raises(ConfigError, match="namespace"):
        Config(namespace="two words")


def test_a_fingerprint_hook_chooses_what_makes_two_requests_one(dsn):
    runner = Runner(dsn, Config(fingerprint=canonical_json))
    k = str(uuid.uuid4())
    ok = lambda claim: Response(201, [], b"paid")  # noqa: E731
    first = runner.run(Request("u", "POST", "/fp", [k], b'{"amount": 5, "to": "bob"}'), ok)
    spaced = runner.run(Request("u", "POST", "/fp", [k], b'{"to":"bob","amount":5}'), ok)
    assert first.outcome == "won_completed" and spaced.outcome == "replay"

    fields = Runner(dsn, Config(fingerprint=json_fields("amount")))
    k2 = str(uuid.uuid4())
    fields.run(Request("u", "POST", "/fp", [k2], b'{"amount": 5, "trace": "1"}'), ok)
    assert fields.run(Request("u", "POST", "/fp", [k2], b'{"amount": 5, "trace": "2"}'), ok).replayed
    assert fields.run(Request("u", "POST", "/fp", [k2], b'{"amount": 6}'), ok).outcome == "conflict"
    assert json.loads(canonical_json(b'{"b": 1, "a": [1, 2]}')) == {"a": [1, 2], "b": 1}
    assert canonical_json(b"not json") == b"not json"


def test_flask_malformed_json_is_flasks_400_and_not_stored(dsn):
    flask = pytest.importorskip("flask")

    from pg_idem.wsgi import IdempotencyMiddleware, header

    app = flask.Flask("fidelity")
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, dsn=dsn, principal=header("X-User"))
    runs = []

    @app.post("/orders")
    def order():
        body = flask.request.get_json()  # Flask answers 400 for malformed JSON
        runs.append(body)
        return flask.jsonify(body), 201
    k = str(uuid.uuid4())
    h = {"Idempotency-Key": k, "X-User": "u", "Content-Type": "application/json"}
    with app.test_client() as c:
        bad = c.post("/orders", data=b'{"sku": ', headers=h)
        fixed = c.post("/orders", data=b'{"sku": "a"}', headers=h)
    assert bad.status_code == 400 and fixed.status_code == 201 and runs == [{"sku": "a"}]
