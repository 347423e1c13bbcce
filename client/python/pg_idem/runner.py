"""The blocking runner: psycopg.Connection, a renewal thread per winner."""

import collections
import functools
import inspect
import threading
import time
import weakref

import psycopg
import psycopg.conninfo
from psycopg import pq

from . import _engine as e
from . import _flight
from . import protocol
from ._checks import StartupWait
from ._pool import PoolExhausted, Slots, getconn_args
from .config import Config


def utf8_kwargs(conninfo, kwargs):
    """kwargs with client_encoding=UTF8 unless the caller chose one: on a
    SQL_ASCII database psycopg otherwise returns every text column as bytes
    (the server does not convert from SQL_ASCII, so UTF8 is what it sends)."""
    chosen = "client_encoding" in kwargs
    if not chosen:
        try:
            chosen = "client_encoding" in psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError:
            chosen = True  # let psycopg report the bad conninfo itself
    return kwargs if chosen else dict(kwargs, client_encoding="UTF8")


class SimplePool:
    """A small bounded connection pool (psycopg_pool.ConnectionPool works as
    well: the runner only calls getconn() and putconn()).

    At most max_size connections are open (10: 150 duplicates at once used
    to open 97 and met "remaining connection slots are reserved"); getconn
    waits up to timeout seconds for one to come back (the protocol's pool
    wait, 5 s), then raises pg_idem.PoolExhausted (the request is answered
    503 connection-pool-exhausted). Waiters are served in turn: a request
    that hands a connection back and asks again at once (a duplicate
    between its wait slices) queues behind those already waiting instead of
    taking it from them. Connections are opened on demand in autocommit,
    with client_encoding UTF8 unless conninfo or kwargs set one."""

    def __init__(self, conninfo="", max_size=10, timeout=protocol.POOL_WAIT, max_idle=None, **kwargs):
        if not isinstance(max_size, int) or max_size < 1:
            raise ValueError("pg_idem.SimplePool: max_size must be a positive integer")
        self.conninfo, self.max_size, self.timeout = conninfo, max_size, timeout
        self.max_idle = max_size if max_idle is None else max_idle
        self.kwargs = utf8_kwargs(conninfo, kwargs)
        self._idle, self._open = [], 0
        self._queue = collections.deque()  # the waiters, first come first served
        self._cond = threading.Condition()

    def _take(self, overflow):
        """An idle connection, True when one may be opened, or None (under _cond)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                return conn
            conn.close()
            self._open -= 1
        if overflow or self._open < self.max_size:
            self._open += 1
            return True
        return None

    def getconn(self, overflow=False, timeout=None):
        """A connection; overflow: at once, even with max_size out (a
        request's second connection: the runner holds at most one per
        request beyond the bound, so at most 2 * max_size are open);
        timeout: the longest wait (seconds) if shorter than the pool's."""
        waited = self.timeout if timeout is None else min(timeout, self.timeout)
        deadline = time.monotonic() + waited
        with self._cond:
            got = self._take(True) if overflow else None
            if got is None:
                me = object()
                self._queue.append(me)
                try:
                    while got is None:
                        got = self._take(False) if self._queue[0] is me else None
                        left = deadline - time.monotonic()
                        if got is None and left <= 0:
                            raise PoolExhausted(self.max_size, waited)
                        if got is None:
                            self._cond.wait(left)
                finally:
                    self._queue.remove(me)
                    self._cond.notify_all()  # the next in turn looks again
            if got is not True:
                return got
        try:
            return psycopg.connect(self.conninfo, autocommit=True, **self.kwargs)
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify_all()
            raise

    def putconn(self, conn):
        keep = not (conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE)
        with self._cond:
            if keep and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                self._cond.notify_all()
                return
            self._open -= 1
            self._cond.notify_all()
        conn.close()

    def connection(self):
        """`with pool.connection() as conn:` for the application's own queries."""
        pool = self

        class _Ctx:
            def __enter__(self):
                self.conn = pool.getconn()
                return self.conn

            def __exit__(self, *exc):
                pool.putconn(self.conn)

        return _Ctx()

    def close(self):
        with self._cond:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            conn.close()


def _pool_of(source):
    if isinstance(source, str):
        return SimplePool(source)  # pooler-safe: the runner checks each connection for a pooler
    if hasattr(source, "getconn") and hasattr(source, "putconn"):
        return source
    raise TypeError("pass a conninfo string, a pg_idem.SimplePool or a psycopg_pool.ConnectionPool")


class _Keeper:
    """Renews the winner's lease every renew_interval on the claim's own
    connection while the handler runs; stops once the claim is lost."""

    def __init__(self, engine, conn, ck, claim_id):
        self.engine, self.conn, self.ck, self.claim_id = engine, conn, ck, claim_id
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pg_idem-renew", daemon=True)
        self._thread.start()

    def _loop(self):
        cfg = self.engine.cfg
        wait = cfg.renew_interval
        while not self._stop.wait(wait):
            wait = cfg.renew_interval
            try:
                t = self.conn.execute(self.engine.calls.renew,
                                      dict(ck=self.ck, claim=self.claim_id, lease=e._ms_text(cfg.lease),
                                           lock=e._lock_wait_text(cfg.renew_interval))).fetchone()
                if not t or not t[0]:
                    self.lost = True  # taken over: stop renewing
                    return
            except psycopg.Error:
                if self.conn.broken:
                    return
                wait = max(0.001, cfg.renew_interval / 4)  # e.g. lock_timeout: sooner, not in a tight loop

    def stop(self):
        self._stop.set()
        self._thread.join()


class Runner:
    """Runs a handler once per Idempotency-Key. Thread safe: share one per pool.

        runner = Runner(pool, Config(lease=10, follower_wait_budget=2))
        result = runner.run(Request("user-17", "POST", "/payments", [key], body),
                            lambda claim: Response(201, [("Content-Type", "application/json")], b"{}"))
    """

    def __init__(self, pool, config=None, *, on_error=None, metrics=None):
        """on_error(report): called with a pg_idem.ErrorReport for every store
        error (each cause is also logged once to the "pg_idem" logger);
        metrics: a pg_idem.metrics.PrometheusMetrics (or anything with
        on_outcome(name) and on_event(name))."""
        self.pool = _pool_of(pool)
        self.slots = Slots(self.pool)  # the waiting duplicates' share of the pool
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

    def check(self, wait=None):
        """The check the first request makes, now: call it at start-up, to
        refuse to start. The extension is installed, new enough, callable by
        this role and on its search_path, and Config.lease is within
        idem.max_lease; the role and the database exist. A server that does
        not answer yet (nothing listens, or it is starting up) is tried again
        for up to `wait` seconds (protocol.STARTUP_WAIT, 10). Raises
        pg_idem.StoreMisconfigured saying what to fix."""
        waiting = StartupWait(wait, self.pool)
        while True:
            try:
                return self._drive(self.engine.check())
            except Exception as exc:  # noqa: BLE001 -- StartupWait raises what is not a wait
                pause = waiting.pause(exc)
            time.sleep(pause)

    def run(self, request, handler):
        """Lease mode: handler(claim) -> Response, with no transaction open."""
        return self.engine.observe(request, self._drive(self.engine.run(request, handler)))

    def run_fenced(self, request, handler, isolation=None):
        """Claim first; handler(conn, claim) runs in a transaction on a second
        connection, in which the response is stored, fenced by the claim."""
        return self.engine.observe(request, self._drive(self.engine.run_fenced(request, handler, isolation)))

    def run_in_transaction(self, request, handler, isolation=None):
        """BEGIN; idem_begin; handler(conn, claim); idem_finalize; COMMIT."""
        return self.engine.observe(request, self._drive(self.engine.run_in_transaction(request, handler, isolation)))

    def idempotent(self, mode="lease", isolation=None):
        """Decorator: f(request, claim) for mode="lease", f(request, conn, claim)
        for "fenced" and "in_transaction"; the wrapped function takes the
        pg_idem.Request and returns the RunResult."""
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")

        def wrap(fn):
            @functools.wraps(fn)
            def call(request):
                if mode == "lease":
                    return self.run(request, lambda claim: fn(request, claim))
                h = lambda conn, claim: fn(request, conn, claim)  # noqa: E731
                if mode == "fenced":
                    return self.run_fenced(request, h, isolation)
                return self.run_in_transaction(request, h, isolation)
            return call
        return wrap

    # ---- the driver ------------------------------------------------------------------

    def _acquire(self, second=False, timeout=None, duplicate=False):
        slot = duplicate and self.slots.take(timeout)
        try:
            # A request's second connection from pg_idem's own pool does not wait for the bound.
            conn = self.pool.getconn(**getconn_args(self.pool, second, timeout))
        except BaseException:
            if slot:
                self.slots.give_back()
            raise
        if slot:
            self.slots.bind(conn)
        try:
            if not conn.autocommit:
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    conn.rollback()
                conn.autocommit = True
                self._autocommit[id(conn)] = True
            if conn not in self._seen:
                # Once per connection: behind a pooler, which answers with a
                # backend pid of its own, nothing is prepared (each
                # transaction may reach another server session).
                self._seen.add(conn)
                if conn.execute(e.BACKEND_PID, prepare=False).fetchone()[0] != conn.info.backend_pid:
                    conn.prepare_threshold = None
        except BaseException:
            self._release(conn)
            raise
        return conn

    def _release(self, conn, discard=False):
        self.slots.give_back(conn)
        if discard and not conn.closed:
            conn.close()  # its prepared statements are not its server session's
        try:
            if not conn.broken and not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            if self._autocommit.pop(id(conn), False) and not conn.closed:
                conn.autocommit = False
        except psycopg.Error:
            pass
        self.pool.putconn(conn)

    def _query(self, op):
        try:
            cur = op.conn.execute(op.sql, op.params, prepare=op.prepare)
        except psycopg.Error as exc:
            if not e.unprepared_retry(op, exc):
                raise
            cur = op.conn.execute(op.sql, op.params, prepare=False)
        return cur.fetchone() if cur.description else None

    def _batch(self, op):
        if not e.pipeline_mode():
            return [self._query(q) for q in op.queries]
        return _flight.send(op.queries[0].conn, op.queries)

    def _do(self, op):
        if isinstance(op, e.Query):
            return self._query(op)
        if isinstance(op, e.Batch):
            return self._batch(op)
        if isinstance(op, e.Acquire):
            return self._acquire(op.second, op.timeout, op.duplicate)
        if isinstance(op, e.Release):
            return self._release(op.conn, op.discard)
        if isinstance(op, e.Sleep):
            threading.Event().wait(op.seconds)
            return None
        if isinstance(op, e.CallHandler):
            value = op.fn(*op.args)
            if inspect.isawaitable(value):
                raise TypeError("an async handler needs pg_idem.aio.AsyncRunner")
            return value
        if isinstance(op, e.StartKeeper):
            return _Keeper(self.engine, op.conn, op.cache_key, op.claim_id)
        if isinstance(op, e.StopKeeper):
            return op.keeper.stop()
        raise AssertionError(op)

    def _advance(self, gen, value=None, error=None, stop_at_handler=False):
        """Runs the protocol's I/O until it ends ("done", result) or, with
        stop_at_handler, until it asks for the handler ("handler", op)."""
        while True:
            try:
                op = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return "done", stop.value
            if stop_at_handler and isinstance(op, e.CallHandler):
                return "handler", op
            value, error = None, None
            try:
                value = self._do(op)
            except Exception as exc:  # handed to the protocol, which decides
                error = exc

    def _drive(self, gen):
        return self._advance(gen)[1]

    def claim(self, request, mode="lease", isolation=None):
        """Context manager form of the three modes: the with block is the handler.

            with runner.claim(req, mode="fenced") as c:
                if c.answer is None:          # we won: run, then respond
                    c.conn.execute(...)       # fenced / in_transaction: the transaction
                    c.respond(Response(201, [], b"paid"))
            send(c.result.response)

        c.answer is the response to send when the block must not run (a
        replay, a problem); c.result is the RunResult after the block. An
        exception in the block puts the key in cooldown and propagates. The
        block runs at most once: where run_fenced / run_in_transaction would
        run the handler again (a 40001 retry, a claim won again after a
        steal), RetryRequest is raised instead."""
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")
        if mode == "lease":
            return _ClaimScope(self, request, self.engine.run(request, None))
        if mode == "fenced":
            return _ClaimScope(self, request, self.engine.run_fenced(request, None, isolation))
        return _ClaimScope(self, request, self.engine.run_in_transaction(request, None, isolation))


class RetryRequest(RuntimeError):
    """The with block of Runner.claim would have to run a second time."""


class _ClaimScope:
    """Drives the protocol up to the handler, lets the with block be it, then finishes."""

    def __init__(self, runner, request, gen):
        self._runner, self._request, self._gen = runner, request, gen
        self.answer = self.result = self.claim = self.conn = None
        self._response = None
        self._open = False

    def respond(self, response):
        self._response = response

    def _enter(self, state):
        kind, value = state
        if kind == "done":
            self.result, self.answer = self._runner.engine.observe(self._request, value), value.response
            return self
        self._open = True
        if len(value.args) == 1:
            self.claim = value.args[0]
        else:
            self.conn, self.claim = value.args
        return self

    def __enter__(self):
        return self._enter(self._runner._advance(self._gen, stop_at_handler=True))

    def __exit__(self, exc_type, exc, tb):
        if not self._open:
            return False
        if exc is not None:
            state = ("error", exc)
        elif self._response is None:
            state = ("error", TypeError("the with block of Runner.claim did not call respond()"))
        else:
            state = ("value", self._response)
        while True:
            kind, v = state
            try:
                out = self._runner._advance(self._gen, value=v if kind == "value" else None,
                                            error=v if kind == "error" else None, stop_at_handler=True)
            except BaseException as raised:
                if raised is exc:
                    return False  # the block's own exception: let it go on
                raise
            if out[0] == "done":
                self.result = self._runner.engine.observe(self._request, out[1])
                return False
            state = ("error", RetryRequest("the request must run again (retry it with the same key)"))
