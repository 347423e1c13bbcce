"""Store errors explain themselves (issue 22): a role without idem_client, a
schema off the search_path, an extension older than the client supports and
a lease over idem.max_lease are each refused at the first use (or at the
ASGI start-up) with what to fix, logged once per cause to the "pg_idem"
logger and handed to on_error; never a silent 503."""

import asyncio
import datetime
import logging
import re
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner, StoreMisconfigured, protocol
from pg_idem.aio import AsyncRunner

DB = "idem_py_explain"


@pytest.fixture(scope="module")
def setup(dsn):
    """A database with pg_idem in the schema idem, and three login roles: one
    with idem_client and idem on its path, one without the grant, one with
    the grant but without idem on its path."""
    base = dsn.rsplit(" dbname=", 1)[0]
    tag = uuid.uuid4().hex[:8]
    roles = {"good": "idem_py_good_" + tag, "nogrant": "idem_py_nogrant_" + tag,
             "nopath": "idem_py_nopath_" + tag}
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        c.execute("CREATE DATABASE %s" % DB)
        for r in roles.values():
            c.execute("CREATE ROLE %s LOGIN" % r)
    own = base + " dbname=" + DB
    with psycopg.connect(own, autocommit=True) as c:
        c.execute("CREATE SCHEMA idem")
        c.execute("CREATE EXTENSION pg_idem SCHEMA idem")
        c.execute("GRANT idem_client TO %s, %s" % (roles["good"], roles["nopath"]))
        c.execute("ALTER ROLE %s IN DATABASE %s SET search_path = idem, public" % (roles["good"], DB))
        c.execute("ALTER ROLE %s IN DATABASE %s SET search_path = idem, public" % (roles["nogrant"], DB))
    yield {k: "%s user=%s" % (own, v) for k, v in roles.items()}
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        for r in roles.values():
            c.execute("DROP ROLE IF EXISTS %s" % r)


def req(k=None):
    return Request("alice", "POST", "/explained", [k or str(uuid.uuid4())], b"{}")


def ok(claim):
    return Response(201, [], b"ran")


def store_errors(caplog):
    return [r for r in caplog.records if r.name == "pg_idem" and r.levelno >= logging.ERROR]


def test_a_good_role_passes_the_check(setup):
    runner = Runner(setup["good"])
    runner.check()
    assert runner.run(req(), ok).response.status == 201


def test_a_role_without_idem_client_is_told_to_grant_it(setup, caplog):
    reports = []
    runner = Runner(setup["nogrant"], on_error=reports.append)
    with pytest.raises(StoreMisconfigured, match="GRANT idem_client TO idem_py_nogrant_"):
        runner.check()
    caplog.set_level(logging.ERROR, logger="pg_idem")
    results = [runner.run(req(), ok) for _ in range(3)]
    assert [r.response.status for r in results] == [503] * 3
    assert not any(r.handler_ran for r in results)
    lines = store_errors(caplog)
    assert len(lines) == 1, [r.getMessage() for r in lines]  # once per cause, not per request
    assert "may not" in lines[0].getMessage() and "GRANT idem_client" in lines[0].getMessage()
    assert len(reports) == 3 and reports[0].first and not reports[1].first
    assert "GRANT idem_client" in reports[0].fix and reports[0].request.target == "/explained"


def test_a_schema_off_the_search_path_is_named(setup, caplog):
    caplog.set_level(logging.ERROR, logger="pg_idem")
    runner = Runner(setup["nopath"])
    with pytest.raises(StoreMisconfigured, match=r"schema idem .* not on the search_path.*schema='idem'"):
        runner.check()
    assert runner.run(req(), ok).response.status == 503
    assert len(store_errors(caplog)) == 1 and "Config(schema='idem')" in store_errors(caplog)[0].getMessage()
    fixed = Runner(setup["nopath"], Config(schema="idem"))
    fixed.check()
    assert fixed.run(req(), ok).response.status == 201


def test_durations_are_seconds_and_checked_against_max_lease(setup):
    # Config(lease=30000) was meant as milliseconds: 8.3 hours is over idem.max_lease (1 h).
    with pytest.raises(StoreMisconfigured, match=r"Config.lease is 30000 s, over the server's idem.max_lease"):
        Runner(setup["good"], Config(lease=30000)).check()
    assert Config(lease=datetime.timedelta(milliseconds=1500)).lease == 1.5
    Runner(setup["good"], Config(lease=datetime.timedelta(seconds=30))).check()


def test_an_extension_older_than_the_client_is_refused(dsn):
    base = dsn.rsplit(" dbname=", 1)[0]
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS idem_py_old WITH (FORCE)")
        c.execute("CREATE DATABASE idem_py_old")
    try:
        # The protocol's oldest passes the check, and the previous release
        # (whose tables this server's library serves until ALTER EXTENSION
        # UPDATE) serves a run; a version before the oldest is refused (the
        # package installs none: one is stamped by hand).
        with psycopg.connect(base + " dbname=idem_py_old", autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_idem VERSION '%s'" % protocol.OLDEST_EXTENSION)
        Runner(base + " dbname=idem_py_old").check()
        with psycopg.connect(base + " dbname=idem_py_old", autocommit=True) as c:
            c.execute("DROP EXTENSION pg_idem")
            c.execute("CREATE EXTENSION pg_idem VERSION '0.5.0'")
        previous = Runner(base + " dbname=idem_py_old")
        previous.check()
        req = Request("alice", "POST", "/old", [str(uuid.uuid4())], b"{}")
        assert previous.run(req, lambda claim: Response(201, [], b"ok")).outcome == "won_completed"
        assert previous.run(req, lambda claim: Response(500, [], b"no")).replayed
        with psycopg.connect(base + " dbname=idem_py_old", autocommit=True) as c:
            c.execute("UPDATE pg_catalog.pg_extension SET extversion = '0.2.0' WHERE extname = 'pg_idem'")
        with pytest.raises(StoreMisconfigured,
                           match=r"version 0\.2\.0; this client needs %s .*ALTER EXTENSION"
                           % re.escape(protocol.OLDEST_EXTENSION)):
            Runner(base + " dbname=idem_py_old").check()
        with psycopg.connect(base + " dbname=idem_py_old", autocommit=True) as c:
            c.execute("DROP EXTENSION pg_idem")
        with pytest.raises(StoreMisconfigured, match="not installed in the database idem_py_old.*CREATE EXTENSION"):
            Runner(base + " dbname=idem_py_old").check()
    finally:
        with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS idem_py_old WITH (FORCE)")


def test_an_unreachable_server_is_logged_once_with_its_fix(caplog):
    caplog.set_level(logging.ERROR, logger="pg_idem")
    reports = []
    runner = Runner("host=127.0.0.1 port=1 connect_timeout=2", on_error=reports.append)
    assert [runner.run(req(), ok).response.status for _ in range(2)] == [503, 503]
    lines = store_errors(caplog)
    assert len(lines) == 1 and "cannot be reached" in lines[0].getMessage()
    assert len(reports) == 2


def test_fastapi_refuses_to_start_with_a_misconfigured_role(setup):
    fastapi = pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from pg_idem.asgi import IdempotencyMiddleware, header

    app = fastapi.FastAPI()
    app.add_middleware(IdempotencyMiddleware, dsn=setup["nogrant"], principal=header("x-user"))
    with pytest.raises(BaseException, match="GRANT idem_client"):
        with TestClient(app):
            pass
    good = fastapi.FastAPI()
    good.add_middleware(IdempotencyMiddleware, dsn=setup["good"], principal=header("x-user"))

    @good.post("/x")
    async def x():
        return {"ran": True}
    with TestClient(good) as client:
        r = client.post("/x", headers={"Idempotency-Key": str(uuid.uuid4()), "X-User": "u"})
        assert r.status_code == 200


def test_the_async_runner_explains_too(setup):
    async def main():
        runner = AsyncRunner(setup["nopath"])
        with pytest.raises(StoreMisconfigured, match="search_path"):
            await runner.check()
        return (await runner.run(req(), ok)).response.status
    assert asyncio.run(main()) == 503
