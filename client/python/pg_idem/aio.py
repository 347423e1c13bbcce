"""The asyncio runner: psycopg.AsyncConnection, a renewal task per winner."""

import asyncio
import collections
import functools
import inspect
import time
import weakref

import psycopg
from psycopg import pq

from . import _engine as e
from . import _flight
from . import protocol
from ._pool import AsyncSlots, PoolExhausted, getconn_args
from .config import Config
from ._checks import StartupWait
from .runner import RetryRequest, utf8_kwargs


class AsyncSimplePool:
    """A small bounded asyncio connection pool (psycopg_pool.AsyncConnectionPool
    works as well: the runner only awaits getconn() and putconn()); max_size,
    timeout, waiters served in turn and client_encoding UTF8 as
    pg_idem.SimplePool's."""

    def __init__(self, conninfo="", max_size=10, timeout=protocol.POOL_WAIT, max_idle=None, **kwargs):
        if not isinstance(max_size, int) or max_size < 1:
            raise ValueError("pg_idem.aio.AsyncSimplePool: max_size must be a positive integer")
        self.conninfo, self.max_size, self.timeout = conninfo, max_size, timeout
        self.max_idle = max_size if max_idle is None else max_idle
        self.kwargs = utf8_kwargs(conninfo, kwargs)
        self._idle, self._open = [], 0
        self._queue = collections.deque()  # the waiters, first come first served
        self._cond = self._loop = None

    def _bind(self):
        """The condition of the running loop (a test client may run each
        request in a loop of its own)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._cond, self._loop = asyncio.Condition(), loop

    async def getconn(self, overflow=False, timeout=None):
        """A connection; overflow: at once, even with max_size out (a
        request's second connection: the runner holds at most one per
        request beyond the bound, so at most 2 * max_size are open);
        timeout: the longest wait (seconds) if shorter than the pool's."""
        self._bind()
        waited = self.timeout if timeout is None else min(timeout, self.timeout)
        deadline = time.monotonic() + waited
        stale = []  # idle connections found broken, closed outside the condition
        try:
            async with self._cond:
                got = self._take(True, stale) if overflow else None
                if got is None:
                    me = object()
                    self._queue.append(me)
                    try:
                        while got is None:
                            got = self._take(False, stale) if self._queue[0] is me else None
                            if got is None:
                                try:
                                    await asyncio.wait_for(self._cond.wait(), max(0.0, deadline - time.monotonic()))
                                except asyncio.TimeoutError:
                                    raise PoolExhausted(self.max_size, waited) from None
                    finally:
                        self._queue.remove(me)
                        self._cond.notify_all()  # the next in turn looks again
        finally:
            for conn in stale:
                await conn.close()
        if got is not True:
            return got
        try:
            return await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True, **self.kwargs)
        except BaseException:
            async with self._cond:
                self._open -= 1
                self._cond.notify_all()
            raise

    async def putconn(self, conn):
        keep = not (conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE)
        self._bind()
        async with self._cond:
            if keep and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                self._cond.notify_all()
                return
            self._open -= 1
            self._cond.notify_all()
        await conn.close()

    def _take(self, overflow, stale):
        """An idle connection, True when one may be opened, or None (under _cond)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                return conn
            stale.append(conn)
            self._open -= 1
        if overflow or self._open < self.max_size:
            self._open += 1
            return True
        return None

    async def close(self):
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for conn in idle:
            await conn.close()


def _pool_of(source):
    if isinstance(source, str):
        return AsyncSimplePool(source)  # pooler-safe: the runner checks each connection for a pooler
    if hasattr(source, "getconn") and hasattr(source, "putconn"):
        return source
    raise TypeError("pass a conninfo string, a pg_idem.aio.AsyncSimplePool or a "
                    "psycopg_pool.AsyncConnectionPool")


class _Keeper:
    """Renews the lease every renew_interval on the claim's connection while the handler runs."""

    def __init__(self, engine, conn, ck, claim_id):
        self.engine, self.conn, self.ck, self.claim_id = engine, conn, ck, claim_id
        self.lost = False
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self):
        cfg = self.engine.cfg
        wait = cfg.renew_interval
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), wait)
                return
            except asyncio.TimeoutError:
                pass
            wait = cfg.renew_interval
            try:
                cur = await self.conn.execute(self.engine.calls.renew,
                                              dict(ck=self.ck, claim=self.claim_id, lease=e._ms_text(cfg.lease),
                                                   lock=e._lock_wait_text(cfg.renew_interval)))
                t = await cur.fetchone()
                if not t or not t[0]:
                    self.lost = True
                    return
            except psycopg.Error:
                if self.conn.broken:
                    return
                wait = max(0.001, cfg.renew_interval / 4)

    async def stop(self):
        self._stop.set()
        await self._task


class AsyncRunner:
    """The asyncio twin of pg_idem.Runner; handlers may be coroutines."""

    def __init__(self, pool, config=None, *, on_error=None, metrics=None):
        """on_error(report): called with a pg_idem.ErrorReport for every store
        error (each cause is also logged once to the "pg_idem" logger);
        metrics: a pg_idem.metrics.PrometheusMetrics (or anything with
        on_outcome(name) and on_event(name))."""
        self.pool = _pool_of(pool)
        self.slots = AsyncSlots(self.pool)  # the waiting duplicates' share of the pool
        self.engine = e.Engine(config or Config(), on_error, metrics)
        self._autocommit = {}
        self._seen = weakref.WeakSet()  # connections checked for a pooler

    @property
    def config(self):
        return self.engine.cfg

    @property
    def edition(self):
        """Which edition answered the first-use check: "c" (the library) or
        "sql" (the SQL edition); None before it, and through a router."""
        return self.engine.edition

    async def check(self, wait=None):
        """As pg_idem.Runner.check: refuses to start, saying what to fix, and
        waits up to `wait` seconds for a server that does not answer yet."""
        waiting = StartupWait(wait, self.pool)
        while True:
            try:
                return await self._drive(self.engine.check())
            except Exception as exc:  # noqa: BLE001 -- StartupWait raises what is not a wait
                pause = waiting.pause(exc)
            await asyncio.sleep(pause)

    async def run(self, request, handler):
        return self.engine.observe(request, await self._drive(self.engine.run(request, handler)))

    async def run_fenced(self, request, handler, isolation=None):
        return self.engine.observe(request, await self._drive(self.engine.run_fenced(request, handler, isolation)))

    async def run_in_transaction(self, request, handler, isolation=None):
        return self.engine.observe(request, await self._drive(self.engine.run_in_transaction(request, handler, isolation)))

    def idempotent(self, mode="lease", isolation=None):
        """Decorator, as pg_idem.Runner.idempotent, for async functions."""
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")

        def wrap(fn):
            @functools.wraps(fn)
            async def call(request):
                if mode == "lease":
                    return await self.run(request, lambda claim: fn(request, claim))
                h = lambda conn, claim: fn(request, conn, claim)  # noqa: E731
                if mode == "fenced":
                    return await self.run_fenced(request, h, isolation)
                return await self.run_in_transaction(request, h, isolation)
            return call
        return wrap

    async def _acquire(self, second=False, timeout=None, duplicate=False):
        slot = duplicate and await self.slots.take(timeout)
        try:
            # A request's second connection from pg_idem's own pool does not wait for the bound.
            conn = await self.pool.getconn(**getconn_args(self.pool, second, timeout))
        except BaseException:
            if slot:
                self.slots.give_back()
            raise
        if slot:
            self.slots.bind(conn)
        try:
            if not conn.autocommit:
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    await conn.rollback()
                await conn.set_autocommit(True)
                self._autocommit[id(conn)] = True
            if conn not in self._seen:
                # Once per connection: behind a pooler, which answers with a
                # backend pid of its own, nothing is prepared (each
                # transaction may reach another server session).
                self._seen.add(conn)
                row = await (await conn.execute(e.BACKEND_PID, prepare=False)).fetchone()
                if row[0] != conn.info.backend_pid:
                    conn.prepare_threshold = None
        except BaseException:
            await self._release(conn)
            raise
        return conn

    async def _release(self, conn, discard=False):
        self.slots.give_back(conn)
        if discard and not conn.closed:
            await conn.close()  # its prepared statements are not its server session's
        try:
            if not conn.broken and not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                await conn.execute("ROLLBACK")
            if self._autocommit.pop(id(conn), False) and not conn.closed:
                await conn.set_autocommit(False)
        except psycopg.Error:
            pass
        await self.pool.putconn(conn)

    async def _query(self, op):
        try:
            cur = await op.conn.execute(op.sql, op.params, prepare=op.prepare)
        except psycopg.Error as exc:
            if not e.unprepared_retry(op, exc):
                raise
            cur = await op.conn.execute(op.sql, op.params, prepare=False)
        return (await cur.fetchone()) if cur.description else None

    async def _batch(self, op):
        if not e.pipeline_mode():
            return [await self._query(q) for q in op.queries]
        return await _flight.send_async(op.queries[0].conn, op.queries)

    async def _do(self, op):
        if isinstance(op, e.Query):
            return await self._query(op)
        if isinstance(op, e.Batch):
            return await self._batch(op)
        if isinstance(op, e.Acquire):
            return await self._acquire(op.second, op.timeout, op.duplicate)
        if isinstance(op, e.Release):
            return await self._release(op.conn, op.discard)
        if isinstance(op, e.Sleep):
            return await asyncio.sleep(op.seconds)
        if isinstance(op, e.CallHandler):
            value = op.fn(*op.args)
            if inspect.isawaitable(value):
                value = await value
            return value
        if isinstance(op, e.StartKeeper):
            return _Keeper(self.engine, op.conn, op.cache_key, op.claim_id)
        if isinstance(op, e.StopKeeper):
            return await op.keeper.stop()
        raise AssertionError(op)

    async def _advance(self, gen, value=None, error=None, stop_at_handler=False):
        while True:
            try:
                op = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return "done", stop.value
            if stop_at_handler and isinstance(op, e.CallHandler):
                return "handler", op
            value, error = None, None
            try:
                value = await self._do(op)
            except Exception as exc:
                error = exc

    async def _drive(self, gen):
        return (await self._advance(gen))[1]

    def claim(self, request, mode="lease", isolation=None):
        """`async with runner.claim(req, mode=...) as c:` — as pg_idem.Runner.claim."""
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")
        if mode == "lease":
            return _AsyncClaimScope(self, request, self.engine.run(request, None))
        if mode == "fenced":
            return _AsyncClaimScope(self, request, self.engine.run_fenced(request, None, isolation))
        return _AsyncClaimScope(self, request, self.engine.run_in_transaction(request, None, isolation))


class _AsyncClaimScope:
    """Drives the protocol up to the handler, lets the async with block be it, then finishes."""

    def __init__(self, runner, request, gen):
        self._runner, self._request, self._gen = runner, request, gen
        self.answer = self.result = self.claim = self.conn = None
        self._response = None
        self._open = False

    def respond(self, response):
        self._response = response

    async def __aenter__(self):
        kind, value = await self._runner._advance(self._gen, stop_at_handler=True)
        if kind == "done":
            self.result, self.answer = self._runner.engine.observe(self._request, value), value.response
            return self
        self._open = True
        if len(value.args) == 1:
            self.claim = value.args[0]
        else:
            self.conn, self.claim = value.args
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if not self._open:
            return False
        if exc is not None:
            kind, v = "error", exc
        elif self._response is None:
            kind, v = "error", TypeError("the async with block of AsyncRunner.claim did not call respond()")
        else:
            kind, v = "value", self._response
        while True:
            try:
                out = await self._runner._advance(self._gen, value=v if kind == "value" else None,
                                                  error=v if kind == "error" else None, stop_at_handler=True)
            except BaseException as raised:
                if raised is exc:
                    return False
                raise
            if out[0] == "done":
                self.result = self._runner.engine.observe(self._request, out[1])
                return False
            kind, v = "error", RetryRequest("the request must run again (retry it with the same key)")
