"""What the inbox consumer (pg_idem.inbox) and the outbox relay
(pg_idem.outbox) share: the I/O their protocols ask a driver for, the
drivers themselves (blocking and asyncio), connections from a pool, the
statements qualified with a schema, and the error texts they record.

Each protocol is a generator written once: it yields an op (a statement,
the handler's or the publisher's call, closing the connection) and gets
back its result, or has the op's exception thrown into it. SyncDriver and
AsyncDriver carry the ops out; the protocols never do I/O themselves.
"""

import dataclasses
import datetime
import inspect

import psycopg
from psycopg import pq


ISOLATION = {None: "BEGIN", "read committed": "BEGIN", "repeatable read": "BEGIN ISOLATION LEVEL REPEATABLE READ",
             "serializable": "BEGIN ISOLATION LEVEL SERIALIZABLE"}
# Serialization failure and deadlock: the statement may succeed if run again.
TRANSIENT = ("40001", "40P01")
QUERY_CANCELED = "57014"


def qualified(schema, name):
    """schema.name with the schema quoted, or the bare name (search_path)."""
    if not schema:
        return name
    if "\0" in schema:
        raise ValueError("pg_idem: schema contains a NUL byte")
    return '"%s".%s' % (schema.replace('"', '""'), name)


def sqlstate(exc):
    return getattr(exc, "sqlstate", None)


def error_text(exc, max_bytes):
    """The text idem_inbox_fail / idem_outbox_nack records for exc: its
    message (or its type's name), valid UTF-8 without NUL, at most
    max_bytes, cut on a character boundary."""
    text = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
    text = text.replace("\0", " ").encode("utf-8", "replace")
    if len(text) <= max_bytes:
        return text.decode("utf-8")
    return text[:max_bytes].decode("utf-8", "ignore")


def seconds(value, name, low, high):
    """A duration in seconds (a number or a timedelta), checked."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError("%s must be between %g and %g seconds" % (name, low, high))
    return float(value)


def integer(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError("%s must be an integer between %d and %d" % (name, low, high))
    return value


def pool_of(source, async_=False):
    """The application's pool (anything with getconn() and putconn()), or
    pg_idem's own for a conninfo string."""
    if isinstance(source, str):
        if async_:
            from .aio import AsyncSimplePool
            return AsyncSimplePool(source)
        from .runner import SimplePool
        return SimplePool(source)
    if hasattr(source, "getconn") and hasattr(source, "putconn"):
        return source
    raise TypeError("pass a conninfo string or a pool with getconn() and putconn() "
                    "(pg_idem.SimplePool, psycopg_pool.ConnectionPool, or their async twins)")


# ---- the ops ----------------------------------------------------------------------

@dataclasses.dataclass
class Exec:
    """Run sql on conn; send back every row (an empty list when it returns none)."""
    conn: object
    sql: str
    params: tuple = None


@dataclasses.dataclass
class Call:
    """Call fn(*args), awaiting what it returns when that is awaitable; send back its value."""
    fn: object
    args: tuple


@dataclasses.dataclass
class Close:
    """Close conn: the server ends its session (and records an inbox attempt the session holds)."""
    conn: object


class SyncDriver:
    """Carries out ops with blocking calls."""

    def __init__(self, pool):
        self.pool = pool
        self._autocommit = set()

    def acquire(self):
        """A pooled connection in autocommit, with no transaction open."""
        conn = self.pool.getconn()
        try:
            if not conn.autocommit:
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    conn.rollback()
                conn.autocommit = True
                self._autocommit.add(id(conn))
        except BaseException:
            self.pool.putconn(conn)
            raise
        return conn

    def release(self, conn):
        """Gives conn back; one left inside a transaction (an interrupted
        protocol) is closed first: a pool's ROLLBACK would leave an inbox
        attempt to the session, unrecorded."""
        try:
            if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.close()
            if id(conn) in self._autocommit:
                self._autocommit.discard(id(conn))
                if not conn.closed and not conn.broken:
                    conn.autocommit = False
        except psycopg.Error:
            pass
        self.pool.putconn(conn)

    def do(self, op):
        if isinstance(op, Exec):
            cur = op.conn.execute(op.sql, op.params)
            return cur.fetchall() if cur.description else []
        if isinstance(op, Call):
            value = op.fn(*op.args)
            if inspect.isawaitable(value):
                close = getattr(value, "close", None)
                if close:
                    close()
                raise TypeError("an async function needs pg_idem's async twin (AsyncInbox, AsyncDrainer)")
            return value
        if isinstance(op, Close):
            op.conn.close()
            return None
        raise AssertionError(op)

    def drive(self, gen, value=None, error=None, stop_at=None):
        """Runs the protocol until it returns ("done", value) or, with
        stop_at, until it yields an op of that type ("stopped", op)."""
        while True:
            try:
                op = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return "done", stop.value
            if stop_at is not None and isinstance(op, stop_at):
                return "stopped", op
            value, error = None, None
            try:
                value = self.do(op)
            except BaseException as exc:  # the protocol decides what it means
                error = exc


class AsyncDriver:
    """Carries out ops with awaits (psycopg.AsyncConnection)."""

    def __init__(self, pool):
        self.pool = pool
        self._autocommit = set()

    async def acquire(self):
        conn = await self.pool.getconn()
        try:
            if not conn.autocommit:
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    await conn.rollback()
                await conn.set_autocommit(True)
                self._autocommit.add(id(conn))
        except BaseException:
            await self.pool.putconn(conn)
            raise
        return conn

    async def release(self, conn):
        try:
            if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                await conn.close()
            if id(conn) in self._autocommit:
                self._autocommit.discard(id(conn))
                if not conn.closed and not conn.broken:
                    await conn.set_autocommit(False)
        except psycopg.Error:
            pass
        await self.pool.putconn(conn)

    async def do(self, op):
        if isinstance(op, Exec):
            cur = await op.conn.execute(op.sql, op.params)
            return await cur.fetchall() if cur.description else []
        if isinstance(op, Call):
            value = op.fn(*op.args)
            if inspect.isawaitable(value):
                value = await value
            return value
        if isinstance(op, Close):
            await op.conn.close()
            return None
        raise AssertionError(op)

    async def drive(self, gen, value=None, error=None, stop_at=None):
        while True:
            try:
                op = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return "done", stop.value
            if stop_at is not None and isinstance(op, stop_at):
                return "stopped", op
            value, error = None, None
            try:
                value = await self.do(op)
            except BaseException as exc:  # a cancelled task too: the protocol closes its connection
                error = exc
