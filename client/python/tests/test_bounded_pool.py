"""The dsn= pool is bounded (issue 22: 150 duplicates once opened 97
connections and met "remaining connection slots are reserved"): 60
duplicates at once through an AsyncRunner made from a dsn open at most the
pool's 10 connections, run the handler once and all get its response."""

import asyncio
import threading
import time
import uuid

import psycopg

from pg_idem import Request, Response, SimplePool
from pg_idem.aio import AsyncRunner


def peak_connections(dsn, app, stop):
    peak = [0]

    def watch():
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                n = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                              (app,)).fetchone()[0]
                peak[0] = max(peak[0], n)
                time.sleep(0.01)
    t = threading.Thread(target=watch)
    t.start()
    return peak, t


def test_sixty_duplicates_open_at_most_ten_connections(dsn):
    app = "idem_bounded_" + uuid.uuid4().hex[:8]
    stop = threading.Event()
    peak, watcher = peak_connections(dsn, app, stop)
    runs = []

    async def handler(claim):
        runs.append(1)
        await asyncio.sleep(0.3)
        return Response(201, [], b"once")

    async def storm():
        runner = AsyncRunner(dsn + " application_name=" + app)
        k = str(uuid.uuid4())
        got = await asyncio.gather(*(runner.run(Request("u", "POST", "/bounded", [k], b"{}"), handler)
                                     for _ in range(60)))
        await runner.pool.close()
        return got
    try:
        results = asyncio.run(storm())
    finally:
        stop.set()
        watcher.join()
    assert len(runs) == 1
    assert [r.response.status for r in results] == [201] * 60
    assert 1 <= peak[0] <= 10, peak[0]


def test_a_pool_that_stays_exhausted_answers_with_an_error():
    pool = SimplePool("host=127.0.0.1 port=1", max_size=1, timeout=0.2)
    pool._open = 1  # the one connection is out
    t0 = time.monotonic()
    try:
        pool.getconn()
        raise AssertionError("getconn must give up")
    except psycopg.OperationalError as e:
        assert "max_size 1" in str(e)
    assert time.monotonic() - t0 >= 0.2


def test_fenced_requests_holding_every_connection_still_get_their_second(dsn):
    """Fenced mode holds the claim's connection and takes a second for the
    transaction: with every connection of the bound held by claim holders,
    waiting for a second one would starve them all (until the pool's
    timeout, then 500s). The second one is given beyond the bound."""
    from pg_idem import Runner

    pool = SimplePool(dsn, max_size=2, timeout=1)
    runner = Runner(pool)
    gate = threading.Barrier(6)
    results = [None] * 6

    def pay(tx, claim):
        tx.execute("SELECT 1")
        return Response(201, [], b"paid")

    def one(i):
        gate.wait()
        results[i] = runner.run_fenced(Request("u", "POST", "/fenced-bound", [str(uuid.uuid4())], b"{}"), pay)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.response.status for r in results] == [201] * 6
    assert pool._open <= 4
    pool.close()
