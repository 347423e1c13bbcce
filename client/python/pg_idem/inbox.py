"""The message inbox: process each delivered message once, its effects
committing with the record that it was processed (the C++ client's
idem::inbox, client/cpp/include/idem/inbox.hpp, with the same protocol).

    from pg_idem.inbox import Inbox
    inbox = Inbox(pool)

    with inbox.message("billing", delivery.message_id, delivery.body) as m:
        if m.process:                                  # the handler: this block
            m.conn.execute("INSERT INTO invoices (order_id) VALUES (%s)", (order_id,))
    r = m.result
    if r.broker_action == BrokerAction.REQUEUE_AFTER:  # retry: after r.retry_after s
        requeue_later(delivery, r.retry_after)
    elif r.broker_action == BrokerAction.REQUEUE:      # unknown: the redelivery tells
        requeue(delivery)
    else:                                              # processed, duplicate, dead, mismatch
        ack(delivery)

or inbox.handle("billing", message_id, body, handler) with handler(conn).
All on one connection from the pool:

    BEGIN; SELECT idem_inbox_begin(consumer, id, sha256(payload), max_attempts);
      not process -> COMMIT, the answer's outcome;
    SAVEPOINT idem_handler; handler(conn); RELEASE SAVEPOINT idem_handler;
    SELECT idem_inbox_done(consumer, id); COMMIT                    -> processed

The handler raises: ROLLBACK TO SAVEPOINT idem_handler; SELECT ... FROM
idem_inbox_fail(consumer, id, str(error)); COMMIT -> retry (with
retry_after), dead (dead letter staged) or duplicate: the failure is
recorded in the transaction that held the message. The transaction itself
fails (COMMIT, idem_inbox_done, a broken savepoint): ROLLBACK, then
idem_inbox_fail in autocommit on the same connection; if even that fails
the connection is closed, and the server records the attempt as the
session ends. A connection lost during COMMIT is unknown: never run again
here; the broker's redelivery answers duplicate or process.

Serialization failures and deadlocks raised by handle()'s handler under
READ COMMITTED are rerun in place (ROLLBACK TO the savepoint) up to
handler_attempts times, without counting a failed attempt. A with block
runs once: there they are recorded as a failure, and the redelivery is the
retry.

Consumers hold a session-level lock on a message while they process it:
do not put them behind transaction-mode pooling.
"""

import dataclasses
import hashlib

from psycopg import pq

from . import _messages as m
from .protocol import (BROKER_ACTION_OF, INBOX_DEFAULT_MAX_ATTEMPTS, INBOX_MAX_ATTEMPTS, INBOX_RESULT_OF,
                       BrokerAction, InboxAnswer, InboxOutcome)

__all__ = ["Inbox", "AsyncInbox", "InboxResult", "InboxOutcome", "BrokerAction"]


@dataclasses.dataclass
class InboxResult:
    """What handling one delivery did."""
    outcome: InboxOutcome = InboxOutcome.UNKNOWN
    handler_ran: bool = False
    handler_runs: int = 0       # in-place reruns after 40001/40P01 included
    error_count: int = 0        # after a recorded failure: the failed attempts so far
    retry_after: float = 0.0    # seconds before the next delivery (retry only)
    error: BaseException = None  # the handler's or the transaction's, behind retry and unknown

    @property
    def broker_action(self):
        """What to do with the delivery at the broker: ack, requeue, requeue_after."""
        return BROKER_ACTION_OF[self.outcome]


class _Unknown(Exception):
    """The connection was lost while COMMIT was in flight."""


class _Handler(m.Call):
    """The handler's call (where the with block of Inbox.message stops the driver)."""


def _answer(text):
    try:
        return InboxAnswer(text)
    except ValueError:
        raise RuntimeError("pg_idem answered an unknown inbox outcome %r" % (text,)) from None


class _Settings:
    def __init__(self, max_attempts, handler_attempts, isolation, max_error_bytes, schema):
        self.max_attempts = m.integer(max_attempts, "max_attempts", 1, INBOX_MAX_ATTEMPTS)
        self.handler_attempts = m.integer(handler_attempts, "handler_attempts", 1, 100)
        if isolation not in m.ISOLATION:
            raise ValueError("isolation must be one of %s" % ", ".join(repr(k) for k in m.ISOLATION))
        self.isolation = isolation
        self.begin_tx = m.ISOLATION[isolation]
        self.max_error_bytes = m.integer(max_error_bytes, "max_error_bytes", 16, 1024 * 1024)
        self.begin = "SELECT %s(%%s, %%s, %%s, %%s)" % m.qualified(schema, "idem_inbox_begin")
        self.done = "SELECT %s(%%s, %%s)" % m.qualified(schema, "idem_inbox_done")
        self.fail = ("SELECT f.outcome, f.error_count, extract(epoch FROM f.retry_after)::float8"
                     " FROM %s(%%s, %%s, %%s) f" % m.qualified(schema, "idem_inbox_fail"))


def _payload(payload):
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return bytes(payload)


def _commit(conn):
    try:
        yield m.Exec(conn, "COMMIT")
    except Exception as exc:
        if conn.broken or conn.closed:
            raise _Unknown(str(exc)) from exc
        raise


def _read_failure(rows, r):
    r.outcome = INBOX_RESULT_OF[_answer(rows[0][0])]
    r.error_count = rows[0][1] or 0
    r.retry_after = rows[0][2] or 0.0


def _steps(s, conn, consumer, message_id, payload, handler, rerun):
    """One delivery, as the C++ inbox::handle does it (see the top)."""
    key = (consumer, message_id)
    digest = hashlib.sha256(payload).digest()
    r = InboxResult()

    # Begin. Nothing is begun when it fails: a 40001/40P01 is tried again.
    attempt = 0
    while True:
        attempt += 1
        yield m.Exec(conn, s.begin_tx)
        try:
            answer = _answer((yield m.Exec(conn, s.begin, key + (digest, s.max_attempts)))[0][0])
            break
        except Exception as exc:
            if not conn.broken and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                yield m.Exec(conn, "ROLLBACK")
            if m.sqlstate(exc) not in m.TRANSIENT or attempt >= s.handler_attempts:
                raise
    if answer != InboxAnswer.PROCESS:
        yield from _commit(conn)  # a cap reached at begin commits its dead letter
        r.outcome = INBOX_RESULT_OF[answer]
        return r

    # From here on every path accounts for the attempt.
    savepoint = False
    try:
        yield m.Exec(conn, "SAVEPOINT idem_handler")
        savepoint = True
        while True:
            r.handler_ran = True
            r.handler_runs += 1
            try:
                yield _Handler(handler, (conn,))
                break
            except Exception as exc:
                # Only READ COMMITTED reruns in place: the savepoint drops the
                # handler's writes and locks; its next statement takes a new snapshot.
                if (not rerun or m.sqlstate(exc) not in m.TRANSIENT or s.isolation not in (None, "read committed")
                        or r.handler_runs >= s.handler_attempts or conn.broken):
                    raise
                yield m.Exec(conn, "ROLLBACK TO SAVEPOINT idem_handler")
        yield m.Exec(conn, "RELEASE SAVEPOINT idem_handler")
        savepoint = False
        yield m.Exec(conn, s.done, key)
        yield from _commit(conn)
        r.outcome = InboxOutcome.PROCESSED
        return r
    except _Unknown as exc:
        r.outcome, r.error = InboxOutcome.UNKNOWN, exc.__cause__
        return r
    except Exception as exc:
        failure = exc
    except BaseException:
        # KeyboardInterrupt, a cancelled task: the server records the attempt as the session ends.
        yield m.Close(conn)
        raise
    r.error = failure
    if conn.closed or conn.broken:
        r.outcome = InboxOutcome.UNKNOWN  # the session is gone: the server recorded the attempt
        return r
    text = m.error_text(failure, s.max_error_bytes)

    # The handler failed inside its savepoint: record it in the same
    # transaction, which keeps the message locked until the record commits.
    if savepoint and conn.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
        try:
            yield m.Exec(conn, "ROLLBACK TO SAVEPOINT idem_handler")
            rows = yield m.Exec(conn, s.fail, key + (text,))
            yield from _commit(conn)
            _read_failure(rows, r)
            return r
        except _Unknown:
            r.outcome = InboxOutcome.UNKNOWN
            return r
        except Exception:
            pass  # the transaction itself failed: below

    # The transaction is lost: roll it back and record the failure in
    # autocommit on this connection (the server keeps the attempt per session).
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            yield m.Exec(conn, "ROLLBACK")
        _read_failure((yield m.Exec(conn, s.fail, key + (text,))), r)
        return r
    except Exception:
        # Not recorded: close the session; the server records the attempt as it ends.
        yield m.Close(conn)
        r.outcome = InboxOutcome.UNKNOWN
        return r


class _Base:
    def __init__(self, pool, max_attempts, handler_attempts, isolation, max_error_bytes, schema, metrics, async_):
        self.settings = _Settings(max_attempts, handler_attempts, isolation, max_error_bytes, schema)
        self.metrics = metrics
        self.driver = (m.AsyncDriver if async_ else m.SyncDriver)(m.pool_of(pool, async_))

    def _check(self, consumer, message_id):
        if not isinstance(consumer, str) or not isinstance(message_id, str):
            raise TypeError("consumer and message_id are str")

    def _observe(self, r):
        if self.metrics is not None and hasattr(self.metrics, "on_inbox"):
            self.metrics.on_inbox(r.outcome.value)
        return r


class Inbox(_Base):
    """Processes deliveries once. Thread safe: share one between consumer
    threads; each delivery takes its own connection from the pool (a
    conninfo string, pg_idem.SimplePool or psycopg_pool.ConnectionPool)
    and gives it back idle, or closed when an attempt could not be recorded.

    max_attempts: idem_inbox_begin's cap (the failure that reaches it makes
    the message dead); handler_attempts: runs of handle()'s handler on
    40001/40P01 under READ COMMITTED, and tries of idem_inbox_begin;
    isolation: None (the server's default), "read committed", "repeatable
    read" or "serializable"; max_error_bytes: longest error text recorded;
    schema: of the pg_idem functions (None: the search_path); metrics: a
    pg_idem.metrics.PrometheusMetrics (anything with on_inbox(outcome))."""

    def __init__(self, pool, *, max_attempts=INBOX_DEFAULT_MAX_ATTEMPTS, handler_attempts=3, isolation=None,
                 max_error_bytes=2000, schema=None, metrics=None):
        super().__init__(pool, max_attempts, handler_attempts, isolation, max_error_bytes, schema, metrics, False)

    def handle(self, consumer, message_id, payload, handler):
        """Processes one delivery with handler(conn), which writes its effects
        on conn and must neither commit nor roll back; raising marks the
        attempt failed. Errors before the message is begun (bad arguments:
        22023, 22004; misuse: 55000; a lost connection) raise; after that
        the InboxResult tells."""
        self._check(consumer, message_id)
        conn = self.driver.acquire()
        try:
            return self._observe(self.driver.drive(
                _steps(self.settings, conn, consumer, message_id, _payload(payload), handler, True))[1])
        finally:
            self.driver.release(conn)

    def message(self, consumer, message_id, payload):
        """The context manager form: the with block is the handler (see the top)."""
        self._check(consumer, message_id)
        return _Scope(self, consumer, message_id, _payload(payload))


class AsyncInbox(_Base):
    """The asyncio twin of Inbox (psycopg.AsyncConnection; a pool with
    awaitable getconn()/putconn(): pg_idem.aio.AsyncSimplePool or
    psycopg_pool.AsyncConnectionPool). Handlers may be coroutines."""

    def __init__(self, pool, *, max_attempts=INBOX_DEFAULT_MAX_ATTEMPTS, handler_attempts=3, isolation=None,
                 max_error_bytes=2000, schema=None, metrics=None):
        super().__init__(pool, max_attempts, handler_attempts, isolation, max_error_bytes, schema, metrics, True)

    async def handle(self, consumer, message_id, payload, handler):
        self._check(consumer, message_id)
        conn = await self.driver.acquire()
        try:
            return self._observe((await self.driver.drive(
                _steps(self.settings, conn, consumer, message_id, _payload(payload), handler, True)))[1])
        finally:
            await self.driver.release(conn)

    def message(self, consumer, message_id, payload):
        """`async with inbox.message(...) as m:`, as Inbox.message."""
        self._check(consumer, message_id)
        return _AsyncScope(self, consumer, message_id, _payload(payload))


class _ScopeBase:
    """Drives the protocol up to the handler, lets the with block be it,
    then finishes. process: whether the block must do the work (on conn,
    the transaction's connection); result: the InboxResult (at once when
    process is False, after the block otherwise). An exception in the block
    is recorded as the attempt's failure and does not propagate (result.error
    has it); KeyboardInterrupt and other BaseExceptions do, once the
    connection is closed (the server records the attempt)."""

    def __init__(self, inbox, consumer, message_id, payload):
        self._inbox, self._args = inbox, (consumer, message_id, payload)
        self._gen = self._conn = None
        self.process, self.conn, self.result = False, None, None

    def _start(self, conn):
        self._conn = conn
        self._gen = _steps(self._inbox.settings, conn, *self._args, None, False)

    def _entered(self, state):
        kind, value = state
        if kind == "done":
            self.result = self._inbox._observe(value)
        else:
            self.process, self.conn = True, value.args[0]
        return self

    @property
    def outcome(self):
        return self.result.outcome if self.result else None


class _Scope(_ScopeBase):
    def __enter__(self):
        d = self._inbox.driver
        self._start(d.acquire())
        try:
            state = d.drive(self._gen, stop_at=_Handler)
        except BaseException:
            d.release(self._conn)
            raise
        if state[0] == "done":
            d.release(self._conn)
        return self._entered(state)

    def __exit__(self, exc_type, exc, tb):
        if not self.process:
            return False
        d = self._inbox.driver
        try:
            kind, value = d.drive(self._gen, error=exc, stop_at=_Handler)
            assert kind == "done", "the with block of Inbox.message runs once"
            self.result = self._inbox._observe(value)
        finally:
            self.conn = None
            d.release(self._conn)
        return exc is None or isinstance(exc, Exception)


class _AsyncScope(_ScopeBase):
    async def __aenter__(self):
        d = self._inbox.driver
        self._start(await d.acquire())
        try:
            state = await d.drive(self._gen, stop_at=_Handler)
        except BaseException:
            await d.release(self._conn)
            raise
        if state[0] == "done":
            await d.release(self._conn)
        return self._entered(state)

    async def __aexit__(self, exc_type, exc, tb):
        if not self.process:
            return False
        d = self._inbox.driver
        try:
            kind, value = await d.drive(self._gen, error=exc, stop_at=_Handler)
            assert kind == "done", "the with block of AsyncInbox.message runs once"
            self.result = self._inbox._observe(value)
        finally:
            self.conn = None
            await d.release(self._conn)
        return exc is None or isinstance(exc, Exception)
