"""Followers use the server-side wait, idem_claim(..., max_wait), as soon as
the server has it (pg_idem 0.3.0). Whether a follower really waited inside
the server is read off the extension's own counter, idem_stats'
follower_waits (the test cluster preloads pg_idem)."""

import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner

DB = "idem_py_wait_test"

def follower_waits(conn):
    """Claims that waited in the server so far (counted at their commit)."""
    return conn.execute("SELECT value FROM idem_stats WHERE counter = 'follower_waits'").fetchone()[0]


@pytest.fixture(scope="module")
def wait_dsn(dsn):
    base = dsn.rsplit(" dbname=", 1)[0]
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        c.execute("CREATE DATABASE %s" % DB)
    own = base + " dbname=" + DB
    with psycopg.connect(own, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_idem")
        has4 = c.execute("SELECT count(*) FROM pg_proc WHERE proname IN ('idem_claim', 'idem_begin') "
                         "AND pronargs = 4").fetchone()[0]
        assert has4 == 2, "the server's pg_idem has no max_wait"
    yield own
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)


def held_winner(runner, req):
    """A winner whose handler runs until released: returns once it holds
    the key (no fixed sleep for it to get there), with the thread and
    the release event."""
    holding, release = threading.Event(), threading.Event()
    def handler(*args):
        holding.set()
        release.wait(120)
        return Response(201, [], b"winner")
    t = threading.Thread(target=runner.run, args=(req, handler))
    t.start()
    assert holding.wait(120), "the winner never ran its handler"
    return t, release


def release_when_a_follower_sleeps(dsn, release, function="idem_claim"):
    """Sets release once a call of function sleeps inside the server (its
    wait event is the extension's): after the wait began, however slowly the
    follower got there."""
    def watch():
        with psycopg.connect(dsn, autocommit=True) as c:
            until = time.monotonic() + 60
            while time.monotonic() < until and not c.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Extension' "
                    "AND query LIKE %s AND pid <> pg_backend_pid()", ("%" + function + "%",)).fetchone():
                time.sleep(0.01)
        release.set()
    t = threading.Thread(target=watch)
    t.start()
    return t


def test_followers_wait_in_the_server(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/w", [k], b"{}")
    winner, release = held_winner(Runner(wait_dsn), req)
    with psycopg.connect(wait_dsn, autocommit=True) as c:
        before = follower_waits(c)
        watcher = release_when_a_follower_sleeps(wait_dsn, release)
        follower = Runner(wait_dsn, Config(follower_wait_budget=30))
        r = follower.run(req, lambda claim: Response(201, [], b"follower"))
        winner.join()
        watcher.join()
        assert follower.engine.server_wait == (True, True)
        assert r.replayed and r.response.body == b"winner"
        assert follower_waits(c) > before  # the follower did wait inside the server


def test_server_wait_ends_with_the_budget(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/w", [k], b"{}")
    # The winner holds the key until the follower has answered: the wait
    # ended with the budget, not with the winner (no upper bound on the
    # time, which a busy machine would break).
    winner, release = held_winner(Runner(wait_dsn), req)
    started = time.monotonic()
    r = Runner(wait_dsn, Config(follower_wait_budget=0.4)).run(req, lambda claim: Response(201, [], b"x"))
    waited = time.monotonic() - started
    winner_still_running = winner.is_alive()
    release.set()
    winner.join()
    assert r.response.status == 409 and r.response.header("Retry-After") == "1"
    assert winner_still_running and waited >= 0.35


def test_in_transaction_followers_wait_in_idem_begin(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wtx", [k], b"{}")
    winner, release = held_winner(Runner(wait_dsn), req)
    watcher = release_when_a_follower_sleeps(wait_dsn, release, "idem_begin")
    r = Runner(wait_dsn, Config(follower_wait_budget=30)).run_in_transaction(req, lambda tx, c: Response(201, [], b"x"))
    winner.join()
    watcher.join()
    assert r.replayed and r.response.body == b"winner"


def test_cooldown_is_answered_at_once_not_waited_out(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wc", [k], b"{}")
    # Budget and cooldown far longer than a busy machine's delays: an
    # answer before the budget ran out was not waited out.
    runner = Runner(wait_dsn, Config(failure_cooldown=120, follower_wait_budget=60))
    runner.run(req, lambda claim: Response(503, [], b"down"))
    started = time.monotonic()
    r = runner.run(req, lambda claim: Response(201, [], b"x"))
    assert r.response.status == 503 and not r.handler_ran
    assert time.monotonic() - started < 60


def test_polling_when_told_not_to_use_it(wait_dsn):
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/wp", [k], b"{}")
    with psycopg.connect(wait_dsn, autocommit=True) as c:
        before = follower_waits(c)
        winner, release = held_winner(Runner(wait_dsn), req)
        threading.Timer(0.5, release.set).start()
        r = Runner(wait_dsn, Config(server_wait=False, follower_wait_budget=30)).run(req, lambda claim: Response(201, [], b"x"))
        winner.join()
        after = follower_waits(c)
    assert r.replayed
    assert after == before  # no waiting inside the server


@pytest.fixture(scope="module", params=["current", "0.5.0"])
def lock_dsn(request, dsn):
    """A database with the current extension (lock_wait an argument), and
    one with 0.5.0's (lock_timeout set around the call: the legacy form)."""
    base = dsn.rsplit(" dbname=", 1)[0]
    name = "idem_py_lock_%s" % request.param.replace(".", "_")
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
        c.execute("CREATE DATABASE %s" % name)
    own = base + " dbname=" + name
    with psycopg.connect(own, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_idem" + ("" if request.param == "current" else " VERSION '%s'" % request.param))
    yield own, request.param
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


def test_a_lock_wait_ends_with_the_budget(lock_dsn):
    """A follower whose claim waits on an in-transaction winner's
    uncommitted key gives up with its budget (lock_wait, or lock_timeout on
    an older server), answered in progress while the winner still runs."""
    own, version = lock_dsn
    k = str(uuid.uuid4())
    req = Request("alice", "POST", "/lock", [k], b"{}")
    holding, release = threading.Event(), threading.Event()

    def handler(tx, claim):
        holding.set()
        release.wait(120)
        return Response(201, [], b"winner")
    winner = threading.Thread(target=Runner(own).run_in_transaction, args=(req, handler))
    winner.start()
    assert holding.wait(120), "the winner never ran its handler"
    follower = Runner(own, Config(follower_wait_budget=0.4))
    r = follower.run(req, lambda claim: Response(201, [], b"follower"))
    winner_still_running = winner.is_alive()
    release.set()
    winner.join()
    assert follower.engine.lock_wait is (version == "current")
    assert r.response.status == 409 and not r.handler_ran
    assert winner_still_running
