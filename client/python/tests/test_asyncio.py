"""The asyncio runner against the real server."""

import asyncio
import uuid

import pytest

from pg_idem import Config, Request, Response
from pg_idem.aio import AsyncRunner, AsyncSimplePool


def req(k, body=b"{}"):
    return Request("alice", "POST", "/async", [k], body)


def test_async_single_flight_and_replay(dsn):
    async def main():
        pool = AsyncSimplePool(dsn)
        # 0.9 s of slack per renewal: a slow event loop delays one, never loses the claim.
        r = AsyncRunner(pool, Config(lease=1.0, renew_interval=0.1, follower_wait_budget=10))
        k = str(uuid.uuid4())
        runs = []

        async def handler(claim):
            runs.append(claim.generation)
            await asyncio.sleep(2.0)  # two leases: renewed by the task
            return Response(201, [("Content-Type", "text/plain")], b"async")
        results = await asyncio.gather(*[r.run(req(k), handler) for _ in range(6)])
        again = await r.run(req(k), handler)
        mismatch = await r.run(req(k, b"other"), handler)
        await pool.close()
        return runs, results, again, mismatch
    runs, results, again, mismatch = asyncio.run(main())
    assert len(runs) == 1
    assert all(x.response.body == b"async" for x in results)
    assert sum(x.replayed for x in results) == 5 and not any(x.lease_stolen for x in results)
    assert again.replayed and mismatch.response.status == 422


def test_async_fenced_and_in_transaction(dsn):
    async def main():
        r = AsyncRunner(dsn)
        k1, k2 = str(uuid.uuid4()), str(uuid.uuid4())

        async def handler(tx, claim):
            await tx.execute("INSERT INTO effects VALUES (%s, %s, 'async')", (claim.claim_id, claim.generation))
            return Response(201, [], b"ok")
        a = await r.run_fenced(req(k1), handler)
        b = await r.run_in_transaction(req(k2), handler)
        c = await r.run_in_transaction(req(k2), handler)
        return a, b, c
    a, b, c = asyncio.run(main())
    assert a.outcome == b.outcome == "won_completed" and c.replayed


def test_async_handler_error_propagates(dsn):
    async def main():
        r = AsyncRunner(dsn, Config(failure_cooldown=5))
        k = str(uuid.uuid4())

        async def boom(claim):
            raise ValueError("x")
        with pytest.raises(ValueError):
            await r.run(req(k), boom)
        return await r.run(req(k), boom)
    assert asyncio.run(main()).response.status == 503


def test_async_context_manager(dsn):
    async def main():
        r = AsyncRunner(dsn)
        k = str(uuid.uuid4())
        async with r.claim(req(k), mode="in_transaction") as c:
            assert c.answer is None
            await c.conn.execute("INSERT INTO effects VALUES (%s, %s, 'awith')", (k, c.claim.generation))
            c.respond(Response(201, [], b"awith"))
        async with r.claim(req(k), mode="in_transaction") as again:
            assert again.answer is not None
        return c.result, again.result
    first, again = asyncio.run(main())
    assert first.outcome == "won_completed" and again.replayed and again.response.body == b"awith"
