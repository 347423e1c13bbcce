"""The outbox relay: publishes the events staged with idem_outbox_stage (in
your transactions) to your broker, at least once, in per-key order, from
as many relays as you like (the C++ client's idem::drainer,
client/cpp/include/idem/outbox.hpp, with the same protocol).

    from pg_idem.outbox import Drainer
    def publish(event):                    # raise when the broker did not take it
        channel.basic_publish("orders", event.topic, event.body,
                              pika.BasicProperties(message_id=str(event.id)))
    d = Drainer(pool, publish, batch=100, lease=30)
    threading.Thread(target=d.run).start()  # until d.stop()

Each batch, on one connection and with no transaction held while
publishing:

    SELECT ... FROM idem_outbox_claim(batch, lease)   -- at most batch events, leased to one token
    publish each event in id order
    SELECT idem_outbox_ack(token, published ids)      -- how many were still held
    SELECT ... FROM idem_outbox_nack(token, id, error) -- per failure: retry | dead | stale

and between empty claims `SELECT idem_outbox_wait(slice)`, which returns
as soon as an event is claimable (woken by commits).

At least once: an event whose ack is lost (the relay died or stalled past
its lease, the connection failed) is published again; consumers
deduplicate by event id (pg_idem.inbox). Per-key order: the server hands
out no event while an earlier one of its key is unpublished; when
publishing one fails, the batch's later events of that key are held back
and come back after the lease, behind it. Events are not published once
less than lease_margin is left of the lease (expired). stop() interrupts
an idle wait at once (a cancel request), never a publish: with
FINISH_BATCH (the default) run() publishes and acks the rest of the batch,
with ABANDON_REST it acks what was published and leaves the rest to the
lease. The counts of each batch (BatchReport) are protocol.RELAY_COUNTS.
"""

import asyncio
import dataclasses
import datetime
import inspect
import threading
import time

import psycopg
from psycopg import pq

from . import _messages as m
from .protocol import NACK_COUNT, RELAY_COUNTS, NackOutcome

__all__ = ["Drainer", "AsyncDrainer", "OutboxEvent", "BatchReport", "FINISH_BATCH", "ABANDON_REST"]

FINISH_BATCH = "finish_batch"  # stop(): publish and ack the rest of the current batch
ABANDON_REST = "abandon_rest"  # stop(): ack what is published; the rest returns after the lease
# Longest single idem_outbox_wait: a cancel request that reaches the server
# before the statement starts is ignored, so stop() takes effect within a slice.
WAIT_SLICE = 1.0


@dataclasses.dataclass
class OutboxEvent:
    """One claimed event, as idem_outbox_claim returned it."""
    id: int
    topic: str
    key: str              # None: no per-key order
    payload: str          # a jsonb payload, as JSON text (None for a binary one)
    payload_bytes: bytes  # a bytea payload (None for a JSON one)
    headers: dict         # a JSON object of strings, or None
    attempts: int         # publish attempts, this one included
    created_at: datetime.datetime
    claim_token: str
    lease_expires_at: datetime.datetime

    @property
    def body(self):
        """The payload's bytes: the binary payload, or the JSON text in UTF-8."""
        if self.payload_bytes is not None:
            return bytes(self.payload_bytes)
        return None if self.payload is None else self.payload.encode("utf-8")


class BatchReport:
    """What one batch did (and, summed, what a relay did): a count per
    protocol.RELAY_COUNTS (claimed, published, acked, lease_lost, retried,
    dead, stale, held_back, expired, abandoned)."""

    __slots__ = RELAY_COUNTS

    def __init__(self, **counts):
        for name in RELAY_COUNTS:
            setattr(self, name, counts.pop(name, 0))
        if counts:
            raise TypeError("BatchReport has no count %s" % ", ".join(sorted(counts)))

    def __iadd__(self, other):
        for name in RELAY_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def as_dict(self):
        return {name: getattr(self, name) for name in RELAY_COUNTS}

    def __eq__(self, other):
        return isinstance(other, BatchReport) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "BatchReport(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items() if kv[1])


class _Settings:
    def __init__(self, batch, lease, lease_margin, idle_wait, error_backoff, on_stop, max_error_bytes, schema):
        self.batch = m.integer(batch, "batch", 1, 10000)
        self.lease = m.seconds(lease, "lease", 0.01, 86400)
        self.lease_margin = self.lease / 5 if lease_margin is None else m.seconds(
            lease_margin, "lease_margin", 0, self.lease)
        if self.lease_margin >= self.lease:
            raise ValueError("lease_margin must be less than the lease")
        self.idle_wait = m.seconds(idle_wait, "idle_wait", 0.001, 3600)
        self.error_backoff = m.seconds(error_backoff, "error_backoff", 0.001, 3600)
        if on_stop not in (FINISH_BATCH, ABANDON_REST):
            raise ValueError("on_stop must be FINISH_BATCH or ABANDON_REST")
        self.on_stop = on_stop
        self.max_error_bytes = m.integer(max_error_bytes, "max_error_bytes", 16, 1024 * 1024)
        self.claim = ("SELECT id, topic, key, payload::text, payload_bytes, headers, attempts, created_at,"
                      " claim_token::text, lease_expires_at FROM %s(%%s, %%s)" % m.qualified(schema, "idem_outbox_claim"))
        self.ack = "SELECT %s(%%s::uuid, %%s::bigint[])" % m.qualified(schema, "idem_outbox_ack")
        self.nack = "SELECT n.outcome FROM %s(%%s::uuid, %%s::bigint, %%s) n" % m.qualified(schema, "idem_outbox_nack")
        self.wait = "SELECT %s(%%s)" % m.qualified(schema, "idem_outbox_wait")


class _Publish(m.Call):
    """The publisher's call for one event."""


def _exec_uncanceled(conn, sql, params):
    """Runs a statement again when it was canceled: a cancel request meant
    for idem_outbox_wait (stop()) can land on the statement after it."""
    try:
        return (yield m.Exec(conn, sql, params))
    except psycopg.errors.QueryCanceled:
        return (yield m.Exec(conn, sql, params))


def _batch(s, conn, publish, abandoning):
    """Claims one batch, publishes it, acks and nacks (see the top)."""
    rep = BatchReport()
    sent = time.monotonic()
    rows = yield from _exec_uncanceled(conn, s.claim, (s.batch, datetime.timedelta(seconds=s.lease)))
    rep.claimed = len(rows)
    if not rows:
        return rep
    deadline = sent + s.lease - s.lease_margin
    token = rows[0][8]
    published, failed, blocked = [], [], set()
    for row in rows:
        event = OutboxEvent(*row)
        if abandoning():
            rep.abandoned += 1
            continue
        if time.monotonic() >= deadline:
            rep.expired += 1
            continue
        if event.key is not None and event.key in blocked:
            rep.held_back += 1
            continue
        try:
            error = "the publisher answered False" if (yield _Publish(publish, (event,))) is False else None
        except Exception as exc:
            error = exc
        if error is None:
            published.append(event.id)
            rep.published += 1
            continue
        if event.key is not None:
            blocked.add(event.key)
        failed.append((event.id, m.error_text(error, s.max_error_bytes)))

    # Ack first: a published event that is not acked is published again.
    if published:
        acked = (yield from _exec_uncanceled(conn, s.ack, (token, published)))[0][0]
        rep.acked, rep.lease_lost = acked, len(published) - acked
    for event_id, error in failed:
        outcome = NackOutcome((yield from _exec_uncanceled(conn, s.nack, (token, event_id, error)))[0][0])
        name = NACK_COUNT[outcome]
        setattr(rep, name, getattr(rep, name) + 1)
    return rep


class _Base:
    def __init__(self, pool, publish, async_, batch, lease, lease_margin, idle_wait, error_backoff, on_stop,
                 max_error_bytes, schema, on_batch, on_error, metrics):
        if not callable(publish):
            raise TypeError("the publisher must be callable")
        self.settings = _Settings(batch, lease, lease_margin, idle_wait, error_backoff, on_stop, max_error_bytes,
                                  schema)
        self.publish, self.on_batch, self.on_error, self.metrics = publish, on_batch, on_error, metrics
        self.driver = (m.AsyncDriver if async_ else m.SyncDriver)(m.pool_of(pool, async_))
        self._lock = threading.RLock()  # guards _total and _waiting (re-entered by a signal handler)
        self._total = BatchReport()
        self._waiting = None            # the connection inside idem_outbox_wait
        self._stopping = False
        self._running = False

    def _abandoning(self):
        return self._stopping and self.settings.on_stop == ABANDON_REST

    def _batch(self, conn):
        return _batch(self.settings, conn, self.publish, self._abandoning)

    def _account(self, rep):
        if rep.claimed == 0:
            return rep
        with self._lock:
            self._total += rep
        if self.metrics is not None and hasattr(self.metrics, "on_relay"):
            self.metrics.on_relay(rep)
        if self.on_batch is not None:
            self.on_batch(rep)
        return rep

    def _recovered(self, exc, conn):
        """After a database error in run(): report it; whether conn is to be dropped."""
        if self.on_error is not None:
            self.on_error(exc)
        return conn is not None and (conn.closed or conn.broken
                                     or conn.info.transaction_status != pq.TransactionStatus.IDLE)

    def _cancel_wait(self):
        with self._lock:
            self._stopping = True
            waiting = self._waiting
        if waiting is not None:
            try:
                waiting.cancel()  # best effort: the slice ends by itself anyway
            except Exception:
                pass

    @property
    def stop_requested(self):
        return self._stopping

    def totals(self):
        """The sum of every batch so far."""
        with self._lock:
            total = BatchReport()
            total += self._total
            return total

    def _slices(self):
        """The lengths of the idem_outbox_wait statements of one idle wait."""
        until = time.monotonic() + self.settings.idle_wait
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            yield min(left, WAIT_SLICE)

    def _enter_wait(self, conn):
        with self._lock:
            if self._stopping:
                return False
            self._waiting = conn
            return True

    def _leave_wait(self):
        with self._lock:
            self._waiting = None


class Drainer(_Base):
    """One relay: run() on one thread at a time, stop() and totals() from
    any. Run several (threads or processes) for throughput; each takes its
    own connection from the pool (a conninfo string, pg_idem.SimplePool or
    psycopg_pool.ConnectionPool).

    publish(event) returns when the broker took the event and raises (or
    returns False) when it did not: the exception's text is recorded by
    idem_outbox_nack. batch: events per claim (1..10000); lease: seconds a
    claim holds its events (the server refuses more than idem.max_lease);
    lease_margin: publishing stops this long before the lease ends (None:
    lease / 5); idle_wait: longest idem_outbox_wait between empty claims;
    error_backoff: run()'s pause after a database error; on_stop:
    FINISH_BATCH or ABANDON_REST; on_batch(report) after every batch that
    claimed something; on_error(exc) with each database error run()
    recovers from; metrics: a pg_idem.metrics.PrometheusMetrics (anything
    with on_relay(report))."""

    def __init__(self, pool, publish, *, batch=100, lease=30.0, lease_margin=None, idle_wait=5.0, error_backoff=1.0,
                 on_stop=FINISH_BATCH, max_error_bytes=2000, schema=None, on_batch=None, on_error=None, metrics=None):
        if inspect.iscoroutinefunction(publish):
            raise TypeError("an async publisher needs pg_idem.outbox.AsyncDrainer")
        super().__init__(pool, publish, False, batch, lease, lease_margin, idle_wait, error_backoff, on_stop,
                         max_error_bytes, schema, on_batch, on_error, metrics)
        self._wake = threading.Event()

    def drain_once(self):
        """Claims one batch and publishes it (claimed == 0: nothing was
        claimable). Database errors raise."""
        conn = self.driver.acquire()
        try:
            return self._account(self.driver.drive(self._batch(conn))[1])
        finally:
            self.driver.release(conn)

    def run(self):
        """Drains until stop(): claims while batches come back, waits with
        idem_outbox_wait when one comes back empty; recovers from database
        errors (on_error, error_backoff, a new connection if the old one
        broke). Returns once stopped."""
        with self._lock:
            if self._running:
                raise RuntimeError("Drainer.run: already running on another thread")
            self._running = True
        conn = None
        try:
            while not self._stopping:
                try:
                    if conn is None:
                        conn = self.driver.acquire()
                    if self._account(self.driver.drive(self._batch(conn))[1]).claimed > 0:
                        continue
                    if not self._wait_for_work(conn):
                        break
                except psycopg.Error as exc:
                    if self._recovered(exc, conn):
                        conn.close()
                    if conn is not None:
                        self.driver.release(conn)
                        conn = None
                    self._wake.wait(self.settings.error_backoff)
        finally:
            if conn is not None:
                self.driver.release(conn)
            with self._lock:
                self._running = False

    def _wait_for_work(self, conn):
        """False when stopped; True when work is claimable or idle_wait passed."""
        for length in self._slices():
            if not self._enter_wait(conn):
                return False
            try:
                found = conn.execute(self.settings.wait, (datetime.timedelta(seconds=length),)).fetchone()[0]
            except psycopg.errors.QueryCanceled:
                if self._stopping:
                    return False
                raise
            finally:
                self._leave_wait()
            if self._stopping:
                return False
            if found:
                return True
        return not self._stopping

    def stop(self):
        """Asks run() to return; safe from any thread (and a signal
        handler's), also before run() starts. Cannot be undone."""
        self._cancel_wait()
        self._wake.set()


class AsyncDrainer(_Base):
    """The asyncio twin of Drainer: `await d.run()` in a task, d.stop()
    from the same event loop; the publisher may be a coroutine function."""

    def __init__(self, pool, publish, *, batch=100, lease=30.0, lease_margin=None, idle_wait=5.0, error_backoff=1.0,
                 on_stop=FINISH_BATCH, max_error_bytes=2000, schema=None, on_batch=None, on_error=None, metrics=None):
        super().__init__(pool, publish, True, batch, lease, lease_margin, idle_wait, error_backoff, on_stop,
                         max_error_bytes, schema, on_batch, on_error, metrics)
        self._wake = None

    def _event(self):
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def drain_once(self):
        conn = await self.driver.acquire()
        try:
            return self._account((await self.driver.drive(self._batch(conn)))[1])
        finally:
            await self.driver.release(conn)

    async def run(self):
        with self._lock:
            if self._running:
                raise RuntimeError("AsyncDrainer.run: already running")
            self._running = True
        wake = self._event()
        conn = None
        try:
            while not self._stopping:
                try:
                    if conn is None:
                        conn = await self.driver.acquire()
                    if self._account((await self.driver.drive(self._batch(conn)))[1]).claimed > 0:
                        continue
                    if not await self._wait_for_work(conn):
                        break
                except psycopg.Error as exc:
                    if self._recovered(exc, conn):
                        await conn.close()
                    if conn is not None:
                        await self.driver.release(conn)
                        conn = None
                    try:
                        await asyncio.wait_for(wake.wait(), self.settings.error_backoff)
                    except asyncio.TimeoutError:
                        pass
        finally:
            if conn is not None:
                await self.driver.release(conn)
            with self._lock:
                self._running = False

    async def _wait_for_work(self, conn):
        for length in self._slices():
            if not self._enter_wait(conn):
                return False
            try:
                cur = await conn.execute(self.settings.wait, (datetime.timedelta(seconds=length),))
                found = (await cur.fetchone())[0]
            except psycopg.errors.QueryCanceled:
                if self._stopping:
                    return False
                raise
            finally:
                self._leave_wait()
            if self._stopping:
                return False
            if found:
                return True
        return not self._stopping

    def stop(self):
        """Asks run() to return (from the event loop's thread)."""
        self._cancel_wait()
        self._event().set()
