"""Followers use the server-side wait, idem_claim(..., max_wait), as soon as
the server has it. Until the extension ships the 4-argument functions, this
database gets stand-ins (PL/pgSQL, polling inside the server, added to the
extension so that the runner's pg_proc check sees them); with a server that
has them, the real ones are used."""

import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner

DB = "idem_py_wait_test"

STAND_INS = """
CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval, max_wait interval)
RETURNS idem_claim_result LANGUAGE plpgsql AS $$
DECLARE
    r idem_claim_result;
    deadline timestamptz := clock_timestamp() + coalesce(max_wait, '0');
BEGIN
    LOOP
        r := idem_claim(cache_key, request_hash, lease);
        EXIT WHEN r.outcome <> 'in_progress' OR clock_timestamp() >= deadline;
        INSERT INTO server_waits VALUES (1);
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN r;
END $$;
CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea, lease interval, max_wait interval)
RETURNS idem_claim_result LANGUAGE plpgsql AS $$
DECLARE
    r idem_claim_result;
    deadline timestamptz := clock_timestamp() + coalesce(max_wait, '0');
BEGIN
    LOOP
        r := idem_begin(cache_key, request_hash, lease);
        EXIT WHEN r.outcome <> 'in_progress' OR clock_timestamp() >= deadline;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN r;
END $$;
ALTER EXTENSION pg_idem ADD FUNCTION idem_claim(bytea, bytea, interval, interval);
ALTER EXTENSION pg_idem ADD FUNCTION idem_begin(bytea, bytea, interval, interval);
"""


@pytest.fixture(scope="module")
def wait_dsn(dsn):
    base = dsn.rsplit(" dbname=", 1)[0]
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        c.execute("CREATE DATABASE %s" % DB)
    own = base + " dbname=" + DB
    with psycopg.connect(own, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_idem")
        c.execute("CREATE TABLE server_waits (n int)")
        has4 = c.execute("SELECT count(*) FROM pg_proc WHERE proname IN ('idem_claim', 'idem_begin') "
                         "AND pronargs = 4").fetchone()[0]
        if has4 == 0:
            c.execute(STAND_INS)
    yield own
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)


def slow_winner(runner, req, seconds, mode="run"):
    def handler(*args):
        time.sleep(seconds)
        return Response(201, [], b"winner")
    t = threading.Thread(target=getattr(runner, mode), args=(req, handler))
    t.start()
    return t


def test_followers_wait_in_the_server(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/w", [k], b"{}")
    winner = slow_winner(Runner(wait_dsn), req, 0.8)
    time.sleep(0.2)
    follower = Runner(wait_dsn, Config(follower_wait_budget=3))
    r = follower.run(req, lambda claim: Response(201, [], b"follower"))
    winner.join()
    assert follower.engine.server_wait == (True, True)
    assert r.replayed and r.response.body == b"winner"
    with psycopg.connect(wait_dsn, autocommit=True) as c:
        stand_in = c.execute("SELECT count(*) > 0 FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                             "WHERE p.proname = 'idem_claim' AND p.pronargs = 4 AND l.lanname = 'plpgsql'").fetchone()[0]
        if stand_in:  # the follower did wait inside the server
            assert c.execute("SELECT count(*) FROM server_waits").fetchone()[0] > 0


def test_server_wait_ends_with_the_budget(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/w", [k], b"{}")
    winner = slow_winner(Runner(wait_dsn), req, 1.2)
    time.sleep(0.2)
    started = time.monotonic()
    r = Runner(wait_dsn, Config(follower_wait_budget=0.4)).run(req, lambda claim: Response(201, [], b"x"))
    waited = time.monotonic() - started
    winner.join()
    assert r.response.status == 409 and r.response.header("Retry-After") == "1"
    assert 0.35 <= waited < 1.1


def test_in_transaction_followers_wait_in_idem_begin(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wtx", [k], b"{}")
    winner = slow_winner(Runner(wait_dsn), req, 0.8)
    time.sleep(0.2)
    r = Runner(wait_dsn, Config(follower_wait_budget=3)).run_in_transaction(req, lambda tx, c: Response(201, [], b"x"))
    winner.join()
    assert r.replayed and r.response.body == b"winner"


def test_cooldown_is_answered_at_once_not_waited_out(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wc", [k], b"{}")
    runner = Runner(wait_dsn, Config(failure_cooldown=2, follower_wait_budget=3))
    runner.run(req, lambda claim: Response(503, [], b"down"))
    started = time.monotonic()
    r = runner.run(req, lambda claim: Response(201, [], b"x"))
    assert r.response.status == 503 and not r.handler_ran
    assert time.monotonic() - started < 0.5


def test_polling_when_told_not_to_use_it(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wp", [k], b"{}")
    with psycopg.connect(wait_dsn, autocommit=True) as c:
        before = c.execute("SELECT count(*) FROM server_waits").fetchone()[0] if _has_table(c) else 0
        winner = slow_winner(Runner(wait_dsn), req, 0.6)
        time.sleep(0.1)
        r = Runner(wait_dsn, Config(server_wait=False, follower_wait_budget=3)).run(req, lambda claim: Response(201, [], b"x"))
        winner.join()
        after = c.execute("SELECT count(*) FROM server_waits").fetchone()[0] if _has_table(c) else 0
    assert r.replayed
    assert after == before  # no waiting inside the server


def _has_table(conn):
    return conn.execute("SELECT to_regclass('server_waits') IS NOT NULL").fetchone()[0]
