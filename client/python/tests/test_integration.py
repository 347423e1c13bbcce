"""Integration tests against the real server (PG_IDEM_TEST_DSN): the contract
of the C++ client, request by request."""

import random
import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner, SimplePool, cache_key


def key():
    return str(uuid.uuid4())


def req(k, body=b'{"amount": 1}', principal="alice", target="/payments"):
    return Request(principal, "POST", target, [k] if k is not None else [], body)


def ok(body=b'{"ok": true}', status=201, headers=None):
    return lambda claim: Response(status, headers or [("Content-Type", "application/json")], body)


@pytest.fixture
def runner(dsn):
    pool = SimplePool(dsn)
    # failure_cooldown 1 s: the longest whose Retry-After is still "1", so a
    # slow machine has the most time to send a retry within it.
    yield Runner(pool, Config(follower_wait_budget=2.0, failure_cooldown=1.0))
    pool.close()


def random_text(rng, n):
    alphabet = "abcXYZ09 /?&=-_.~%é中文🎉\u00a0\u2028'\"\\"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))


def test_cache_key_equals_idem_key_on_random_tuples(db):
    rng = random.Random(16)
    tuples = []
    for _ in range(600):
        k = random_text(rng, 60) or "k"
        tuples.append((random_text(rng, 40), rng.choice(["POST", "PATCH", "put", ""]), random_text(rng, 80), k))
    tuples.append(("p", "POST", "/", "é" * 127))  # 254 bytes
    tuples.append(("p", "POST", "/", "x" * 255))
    cols = list(zip(*tuples))
    rows = db.execute("SELECT idem_key(u.p, u.m, u.t, u.k) FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) "
                   "WITH ORDINALITY AS u(p, m, t, k, n) ORDER BY u.n", [list(c) for c in cols]).fetchall()
    assert len(rows) == len(tuples)
    for (server,), t in zip(rows, tuples):
        assert server == cache_key(*t), t


def test_server_refuses_what_the_client_refuses(db):
    for bad in ("", "x" * 256):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute("SELECT idem_key('p', 'POST', '/', %s)", (bad,))


def test_replay_with_allowlisted_headers_and_marker(dsn):
    r = Runner(dsn, Config(replay_headers=("X-Request-Id",)))
    k = key()
    headers = [("Content-Type", "application/json"), ("Set-Cookie", "sid=1"), ("Authorization", "x"),
               ("X-Request-Id", "r1"), ("X-Session", "s"), ("Location", "/payments/1")]
    first = r.run(req(k), ok(headers=headers))
    assert first.outcome == "won_completed" and first.handler_ran and first.generation > 0
    assert first.response.header("Set-Cookie") == "sid=1"  # the caller gets its own response
    again = r.run(req(k), ok(b"never"))
    assert again.replayed and not again.handler_ran and again.outcome == "replay"
    assert again.response.body == b'{"ok": true}' and again.response.status == 201
    assert again.response.header("Idempotent-Replayed") == "true"
    assert again.response.header("x-request-id") == "r1" and again.response.header("location") == "/payments/1"
    for never in ("Set-Cookie", "Authorization", "X-Session"):
        assert again.response.header(never) is None


def test_another_body_is_refused(dsn, runner):
    k = key()
    runner.run(req(k), ok())
    assert runner.run(req(k, b'{"amount": 2}'), ok()).response.status == 422
    seed = Runner(dsn, Config(profile="conflict409"))
    assert seed.run(req(k, b'{"amount": 2}'), ok()).response.status == 409


def test_principal_method_and_target_are_part_of_the_key(runner):
    k = key()
    assert runner.run(req(k), ok()).handler_ran
    assert runner.run(req(k, principal="bob"), ok()).handler_ran
    assert runner.run(req(k, target="/other"), ok()).handler_ran


def test_absent_key_unguarded_or_400(runner):
    r = runner.run(req(None), ok())
    assert r.outcome == "unguarded" and r.handler_ran
    r = runner.run(Request("a", "POST", "/", [], b"", key_required=True), ok())
    assert r.response.status == 400 and not r.handler_ran


def test_release_on_401_and_3xx(runner):
    for status in (401, 403, 302):
        k = key()
        assert runner.run(req(k), ok(status=status)).response.status == status
        again = runner.run(req(k), ok())
        assert again.handler_ran and again.response.status == 201, status


def test_finalize_on_404(runner):
    k = key()
    runner.run(req(k), ok(status=404))
    again = runner.run(req(k), ok())
    assert again.replayed and again.response.status == 404


def test_failure_cooldown_then_one_retry(runner):
    k = key()
    assert runner.run(req(k), ok(status=503)).response.status == 503
    cool = runner.run(req(k), ok())
    assert cool.response.status == 503 and not cool.handler_ran and cool.response.header("Retry-After") == "1"
    time.sleep(1.1)
    assert runner.run(req(k), ok()).handler_ran


def test_handler_exception_puts_the_key_in_cooldown(runner):
    k = key()

    def boom(claim):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        runner.run(req(k), boom)
    assert runner.run(req(k), ok()).response.status == 503


def test_concurrent_duplicates_run_once(runner):
    k = key()
    runs = []
    results = [None] * 8

    def handler(claim):
        runs.append(claim.generation)
        time.sleep(0.3)
        return Response(201, [("Content-Type", "text/plain")], b"once")

    def go(i):
        results[i] = runner.run(req(k), handler)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1
    assert all(r.response.status == 201 and r.response.body == b"once" for r in results)
    assert sum(r.replayed for r in results) == 7


def test_past_the_wait_budget_409_with_retry_after(dsn):
    k = key()
    slow = Runner(dsn)
    impatient = Runner(dsn, Config(follower_wait_budget=0.3))
    seed = Runner(dsn, Config(follower_wait_budget=0.2, profile="conflict409"))
    # The slow winner holds the key until both followers have answered, so
    # their waits end with their budgets, not with the winner (no upper
    # bound on the time, which a busy machine would break).
    holding, release = threading.Event(), threading.Event()
    def held(c):
        holding.set()
        release.wait(120)
        return Response(201, [], b"x")
    t = threading.Thread(target=slow.run, args=(req(k), held))
    t.start()
    assert holding.wait(120), "the winner never ran its handler"
    started = time.monotonic()
    r = impatient.run(req(k), ok())
    waited = time.monotonic() - started
    s = seed.run(req(k), ok())
    winner_still_running = t.is_alive()
    release.set()
    t.join()
    assert r.response.status == 409 and r.response.header("Retry-After") == "1" and r.outcome == "timeout"
    assert winner_still_running and waited >= 0.25
    assert s.response.status == 503


def test_lease_is_renewed_while_the_handler_runs(dsn, db):
    # Renewed every 0.1 s, the 1 s lease has 0.9 s of slack per renewal; read
    # at 1.5 s, it is live only because it was renewed.
    r = Runner(dsn, Config(lease=1.0, renew_interval=0.1))
    k = key()
    seen = {}

    def handler(claim):
        time.sleep(2.5)  # two and a half leases
        seen["lost"] = claim.lost
        return Response(201, [], b"long")
    t = threading.Thread(target=lambda: seen.setdefault("result", r.run(req(k), handler)))
    t.start()
    time.sleep(1.5)
    ck = cache_key("alice", "POST", "/payments", k)
    state = db.execute("SELECT state, lease_expires_at > now() FROM idem_keys WHERE cache_key = %s", (ck,)).fetchone()
    t.join()
    assert state == ("pending", True)
    res = seen["result"]
    assert res.outcome == "won_completed" and not res.lease_stolen and not seen["lost"]
    assert Runner(dsn).run(req(k), ok()).replayed


def test_over_cap_body_is_stored_not_replayable(dsn):
    r = Runner(dsn, Config(max_cacheable_response_bytes=10))
    k = key()
    first = r.run(req(k), ok(b"x" * 100))
    assert first.outcome == "completed_uncacheable" and first.response.body == b"x" * 100
    again = r.run(req(k), ok())
    assert again.response.status == 409 and not again.handler_ran


def test_fenced_commits_writes_with_the_response(runner, db):
    k = key()

    def handler(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'fenced')", (k, claim.generation))
        return Response(201, [], b"paid")
    r = runner.run_fenced(req(k), handler)
    assert r.outcome == "won_completed"
    assert runner.run_fenced(req(k), handler).replayed
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 1


def test_fenced_failure_rolls_the_writes_back(runner, db):
    k = key()

    def handler(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'fail')", (k, claim.generation))
        return Response(500, [], b"no")
    assert runner.run_fenced(req(k), handler).response.status == 500
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 0
    assert runner.run_fenced(req(k), handler).response.status == 503  # cooldown


def test_fenced_stolen_claim_rolls_back_and_answers_from_the_key(dsn, db):
    r = Runner(dsn)
    k = key()
    ck = cache_key("alice", "POST", "/payments", k)

    def thief(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'thief')", (k, claim.generation))
        return Response(201, [], b"thief")

    def victim(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'victim')", (k, claim.generation))
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT idem_evict(%s)", (ck,))
        assert Runner(dsn).run_fenced(req(k), thief).outcome == "won_completed"
        return Response(201, [], b"victim")
    res = r.run_fenced(req(k), victim)
    assert res.lease_stolen and res.replayed and res.response.body == b"thief"
    notes = [n for (n,) in db.execute("SELECT note FROM effects WHERE k = %s", (k,))]
    assert notes == ["thief"]


def test_in_transaction_mode(runner, db):
    k = key()
    runs = []

    def handler(tx, claim):
        runs.append(1)
        time.sleep(0.3)
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'tx')", (k, claim.generation))
        return Response(201, [], b"tx")
    results = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, runner.run_in_transaction(req(k), handler)))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1 and sum(r.replayed for r in results) == 3
    assert all(r.response.body == b"tx" for r in results)
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 1


def test_in_transaction_failure_keeps_the_cooldown_not_the_writes(runner, db):
    k = key()

    def handler(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'txfail')", (k, claim.generation))
        return Response(503, [], b"down")
    assert runner.run_in_transaction(req(k), handler).response.status == 503
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 0
    assert runner.run_in_transaction(req(k), handler).response.status == 503
    assert not runner.run_in_transaction(req(k), handler).handler_ran


def test_decorator_modes(runner, db):
    @runner.idempotent(mode="fenced")
    def pay(request, tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'decorated')", (request.keys[0], claim.generation))
        return Response(201, [], b"ok")

    @runner.idempotent()
    def lease(request, claim):
        return Response(200, [], str(claim.generation))
    k = key()
    assert pay(req(k)).outcome == "won_completed" and pay(req(k)).replayed
    assert lease(req(key())).handler_ran


def test_server_wait_is_detected_once_per_runner(dsn, db, runner):
    runner.run(req(key()), ok())
    has4 = db.execute("SELECT count(*) > 0 FROM pg_proc WHERE proname = 'idem_claim' AND pronargs = 4").fetchone()[0]
    assert runner.engine.server_wait[0] is has4
    has5 = db.execute("SELECT count(*) > 0 FROM pg_proc WHERE proname = 'idem_claim' AND pronargs = 5").fetchone()[0]
    assert runner.engine.lock_wait is has5 is True
    polling = Runner(dsn, Config(server_wait=False))
    polling.run(req(key()), ok())
    assert polling.engine.server_wait == (False, False)


def test_no_session_state_is_left_behind(dsn):
    pool = SimplePool(dsn, max_idle=1)
    r = Runner(pool, Config(max_cacheable_response_bytes=4))
    r.run(req(key()), ok(b"xxxxxxxx"))
    r.run_in_transaction(req(key()), lambda tx, c: Response(201, [], b"x"))
    with pool.connection() as conn:
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "0"
        assert conn.execute("SELECT current_setting('idem.max_response_bytes', true)").fetchone()[0] != "0"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_works_with_a_psycopg_pool_in_transaction_mode_connections(dsn):
    psycopg_pool = pytest.importorskip("psycopg_pool")
    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=4, kwargs={"prepare_threshold": None}) as pool:
        r = Runner(pool)
        k = key()
        assert r.run_fenced(req(k), lambda tx, c: Response(201, [], b"p")).handler_ran
        assert r.run_fenced(req(k), None).replayed  # the handler is not called
        with pool.connection() as conn:
            assert conn.autocommit is False


def test_context_manager_modes(runner, db):
    k = key()
    with runner.claim(req(k), mode="fenced") as c:
        assert c.answer is None and c.claim.generation > 0
        c.conn.execute("INSERT INTO effects VALUES (%s, %s, 'with')", (k, c.claim.generation))
        c.respond(Response(201, [], b"with"))
    assert c.result.outcome == "won_completed" and c.result.response.body == b"with"
    with runner.claim(req(k), mode="fenced") as again:
        assert again.answer is not None  # the block must not run
    assert again.result.replayed and again.answer.body == b"with"
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 1

    k2 = key()
    with runner.claim(req(k2)) as lease:
        assert lease.conn is None and lease.claim.guarded
        lease.respond(Response(200, [], b"lease"))
    assert lease.result.outcome == "won_completed"
    assert runner.run(req(k2), ok()).replayed

    k3 = key()
    with pytest.raises(ZeroDivisionError):
        with runner.claim(req(k3), mode="in_transaction") as t:
            t.conn.execute("INSERT INTO effects VALUES (%s, %s, 'boom')", (k3, t.claim.generation))
            1 / 0
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k3,)).fetchone()[0] == 0
    assert runner.run(req(k3), ok()).response.status == 503  # cooldown

    with pytest.raises(TypeError):
        with runner.claim(req(key())):
            pass  # no respond()


def test_claim_connection_killed_before_the_finalize(dsn, db):
    # Scenario 22: the backend holding the claim dies; the runner reconnects,
    # reads the key (still its claim, nothing stored) and stores its result.
    pool = SimplePool(dsn + " application_name=idem_victim", max_idle=0)
    r = Runner(pool)
    k = key()

    def handler(claim):
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE application_name = 'idem_victim' AND datname = current_database()")
        return Response(201, [], b"survived")
    res = r.run(req(k), handler)
    assert res.outcome == "won_completed" and res.response.body == b"survived" and not res.outcome_unknown
    again = Runner(dsn).run(req(k), ok())
    assert again.replayed and again.response.body == b"survived"


@pytest.mark.parametrize("mode", ["run_fenced", "run_in_transaction"])
def test_serialization_failure_reruns_the_transaction(runner, db, mode):
    k = key()
    calls = []

    def handler(tx, claim):
        calls.append(claim.generation)
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'retry')", (k, claim.generation))
        if len(calls) == 1:
            tx.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
        return Response(201, [], b"second")
    r = getattr(runner, mode)(req(k), handler, isolation="serializable")
    assert r.response.body == b"second" and r.outcome == "won_completed" and len(calls) == 2
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 1
    assert getattr(runner, mode)(req(k), handler).replayed


def test_in_transaction_database_error_in_the_handler_keeps_a_cooldown(runner, db):
    k = key()

    def handler(tx, claim):
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'dup')", (k, claim.generation))
        tx.execute("SELECT 1/0")
        return Response(201, [], b"never")
    with pytest.raises(psycopg.errors.DivisionByZero):
        runner.run_in_transaction(req(k), handler)
    assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0] == 0
    again = runner.run_in_transaction(req(k), handler)
    assert again.response.status == 503 and not again.handler_ran
