"""The store fails after the handler ran, against the real
server: a finalize the server refuses, a prepared-statement clash on the
finalize (what a transaction-mode pooler does to psycopg's prepared
statements), a backend terminated right after the handler. In every mode
the handler runs once for the key: the runner never releases (or fails) a
key whose handler ran because storing its result failed; what it cannot
store stays pending to its lease and the caller is told the outcome is
unknown."""

import asyncio
import os
import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner, SimplePool, cache_key
from pg_idem.aio import AsyncRunner, AsyncSimplePool

# An AFTER UPDATE trigger on idem_keys that refuses to complete the keys in
# refuse_finalize: idem_finalize raises P0001 for them, every other call works.
REFUSE_SETUP = (
    "CREATE TABLE IF NOT EXISTS refuse_finalize (cache_key bytea PRIMARY KEY)",
    "CREATE OR REPLACE FUNCTION refuse_finalize() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN IF NEW.state = 'completed' AND EXISTS (SELECT 1 FROM public.refuse_finalize r"
    " WHERE r.cache_key = NEW.cache_key) THEN RAISE EXCEPTION 'finalize refused for this key (test)';"
    " END IF; RETURN NULL; END $$",
    "DROP TRIGGER IF EXISTS refuse_finalize ON idem_keys",
    "CREATE TRIGGER refuse_finalize AFTER UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse_finalize()",
)

behind_pooler = pytest.mark.skipif(bool(os.environ.get("PG_IDEM_TEST_POOLER")),
                                   reason="needs the claim's own server session")


@pytest.fixture(scope="module")
def refusing(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        for sql in REFUSE_SETUP:
            c.execute(sql)
    yield
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TRIGGER IF EXISTS refuse_finalize ON idem_keys")
        c.execute("DELETE FROM refuse_finalize")


def req(k, target="/store-errors"):
    return Request("alice", "POST", target, [k], b'{"amount": 5}')


def cache_key_of(r):
    return cache_key(r.principal, r.method, r.target, r.keys[0])


def refuse(db, r, on=True):
    if on:
        db.execute("INSERT INTO refuse_finalize VALUES (%s)", (cache_key_of(r),))
    else:
        db.execute("DELETE FROM refuse_finalize WHERE cache_key = %s", (cache_key_of(r),))


def state(db, r):
    t = db.execute("SELECT state FROM idem_keys WHERE cache_key = %s", (cache_key_of(r),)).fetchone()
    return t[0] if t else None


def wait_for_lease_expiry(db, r, timeout=60):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        t = db.execute("SELECT lease_expires_at < clock_timestamp() FROM idem_keys WHERE cache_key = %s",
                       (cache_key_of(r),)).fetchone()
        if t and t[0]:
            return True
        time.sleep(0.05)
    return False


def effects(db, k):
    return db.execute("SELECT count(*) FROM effects WHERE k = %s", (k,)).fetchone()[0]


def is_outcome_unknown(res):
    return (res.response.status == 503 and b"outcome-unknown" in res.response.body
            and res.response.header("Retry-After") is not None)


def terminate(db, pid):
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    until = time.monotonic() + 30
    while time.monotonic() < until and db.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                                  (pid,)).fetchone():
        time.sleep(0.005)


def squat_statement_names(conn):
    """Creates the names psycopg would prepare next on conn in its server
    session, as a pooler's other clients leave them: its next prepare gets 42P05."""
    taken = {t[0] for t in conn.execute("SELECT name FROM pg_prepared_statements", prepare=False)}
    for n in range(40):
        name = "_pg3_%d" % n
        if name not in taken:
            conn.execute("PREPARE %s AS SELECT 1" % name, prepare=False)


class RecordingPool(SimplePool):
    """Remembers the first connection lent since arm(): the next request's claim connection."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.first = None

    def getconn(self):
        conn = super().getconn()
        if self.first is None:
            self.first = conn
        return conn


def test_lease_refused_finalize_leaves_the_pending_key_to_its_lease(dsn, db, refusing):
    r = Runner(SimplePool(dsn), Config(lease=6, follower_wait_budget=0.3))
    rq = req(str(uuid.uuid4()))
    refuse(db, rq)
    runs = []

    def handler(claim):
        runs.append(claim.generation)
        return Response(201, [], b"charged")
    res = r.run(rq, handler)
    assert res.handler_ran and res.outcome_unknown and res.outcome == "failed"
    assert is_outcome_unknown(res), res.response
    assert getattr(res.error, "sqlstate", None) == "P0001"
    assert state(db, rq) == "pending"  # never released, never failed
    dups = [None] * 6
    threads = [threading.Thread(target=lambda i=i: dups.__setitem__(i, r.run(rq, handler))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(d.handler_ran for d in dups) and all(d.response.status != 201 for d in dups)
    assert len(runs) == 1
    # Once the lease is over the same request recovers the key, once.
    refuse(db, rq, False)
    assert wait_for_lease_expiry(db, rq)
    again = r.run(rq, handler)
    assert again.response.status == 201 and again.outcome == "won_completed" and len(runs) == 2
    assert r.run(rq, handler).replayed and len(runs) == 2


@behind_pooler
def test_lease_prepared_statement_clash_on_finalize_is_stored_unprepared(dsn, db):
    pool = RecordingPool(dsn, prepare_threshold=0)  # every statement prepared, as psycopg does after 5 uses
    r = Runner(pool, Config(lease=10, follower_wait_budget=2))
    rq = req(str(uuid.uuid4()))
    runs = []

    def handler(claim):
        runs.append(1)
        if len(runs) == 1:
            squat_statement_names(pool.first)
        return Response(201, [], b"charged")
    res = r.run(rq, handler)
    assert res.response.status == 201 and res.response.body == b"charged"
    assert res.outcome == "won_completed" and not res.outcome_unknown
    # The clash did happen, and was answered by sending the finalize again
    # unprepared on that connection, which prepares nothing from then on.
    assert res.error is None and pool.first.prepare_threshold is None
    assert state(db, rq) == "completed"
    other = Runner(dsn)
    for _ in range(5):
        d = other.run(rq, handler)
        assert d.replayed and d.response.body == b"charged"
    assert len(runs) == 1
    pool.close()


@pytest.mark.parametrize("mode", ["run_fenced", "run_in_transaction"])
def test_exactly_once_modes_answer_a_refused_finalize(dsn, db, refusing, mode):
    r = Runner(SimplePool(dsn), Config(lease=6, follower_wait_budget=0.3, failure_cooldown=5))
    k = str(uuid.uuid4())
    rq = req(k, "/store-errors/" + mode)
    refuse(db, rq)
    runs = []

    def handler(tx, claim):
        runs.append(1)
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'refused')", (k, claim.generation))
        return Response(201, [], b"paid")
    res = getattr(r, mode)(rq, handler)  # answered, not raised
    assert res.handler_ran and res.outcome == "failed" and is_outcome_unknown(res), res.response
    assert getattr(res.error, "sqlstate", None) == "P0001"
    assert effects(db, k) == 0
    # fenced: the claim committed first and stays pending to its lease;
    # in-transaction: everything rolled back together but a cooldown.
    assert state(db, rq) == ("pending" if mode == "run_fenced" else "failed")
    for _ in range(3):
        assert not getattr(r, mode)(rq, handler).handler_ran
    assert len(runs) == 1


@behind_pooler
@pytest.mark.parametrize("mode", ["run_fenced", "run_in_transaction"])
def test_exactly_once_modes_do_not_rerun_after_the_backend_died(dsn, db, mode):
    r = Runner(SimplePool(dsn), Config(lease=6, follower_wait_budget=0.3))
    k = str(uuid.uuid4())
    rq = req(k, "/store-errors/terminated/" + mode)
    runs = []

    def handler(tx, claim):
        runs.append(1)
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'terminated')", (k, claim.generation))
        terminate(db, tx.info.backend_pid)
        return Response(201, [], b"paid")
    res = getattr(r, mode)(rq, handler)
    assert len(runs) == 1 and res.handler_ran and is_outcome_unknown(res), res.response
    assert effects(db, k) == 0
    if mode == "run_fenced":
        assert state(db, rq) == "pending"
        for _ in range(3):
            assert not r.run_fenced(rq, handler).handler_ran
        assert len(runs) == 1


@behind_pooler
def test_fenced_prepared_statement_clash_cannot_abort_the_handlers_transaction(dsn, db):
    r = Runner(SimplePool(dsn, prepare_threshold=0), Config(lease=10, follower_wait_budget=2,
                                                            failure_cooldown=0.1))
    k = str(uuid.uuid4())
    rq = req(k, "/store-errors/clash-fenced")
    runs = []

    def handler(tx, claim):
        runs.append(1)
        tx.execute("INSERT INTO effects VALUES (%s, %s, 'clash')", (k, claim.generation), prepare=False)
        squat_statement_names(tx)
        return Response(201, [], b"paid")
    res = r.run_fenced(rq, handler)
    assert res.response.status == 201 and res.outcome == "won_completed"
    time.sleep(0.3)  # past the cooldown a failure would have left
    other = Runner(dsn)
    for _ in range(4):
        assert other.run_fenced(rq, handler).replayed
    assert len(runs) == 1 and effects(db, k) == 1


def test_async_lease_refused_finalize_is_not_released(dsn, db, refusing):
    rq = req(str(uuid.uuid4()), "/store-errors/async")
    refuse(db, rq)
    runs = []

    async def handler(claim):
        runs.append(1)
        return Response(201, [], b"charged")

    async def main():
        pool = AsyncSimplePool(dsn)
        r = AsyncRunner(pool, Config(lease=6, follower_wait_budget=0.3))
        first = await r.run(rq, handler)
        dups = await asyncio.gather(*[r.run(rq, handler) for _ in range(4)])
        await pool.close()
        return first, dups
    first, dups = asyncio.run(main())
    assert first.handler_ran and first.outcome_unknown and is_outcome_unknown(first)
    assert state(db, rq) == "pending"
    assert not any(d.handler_ran for d in dups) and len(runs) == 1
