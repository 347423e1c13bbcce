"""A Batch (pg_idem._ops) in one flight: libpq's pipeline mode on psycopg's
own libpq connection (Connection.pgconn), every statement queued in
libpq and the lot flushed once, with one Sync.

Why not psycopg's Connection.pipeline(): psycopg 3.1 writes each
statement to the socket as it is queued and waits on the socket around
each, so the server is woken once per statement and the client pays a
poll and a send for each. On this project's 2-core test machine
(tests/bench/client/modes_bench.py, docs/benchmarks.md) four statements
took 1.2-1.3 ms that way against 0.8-1.0 ms one by one, and 0.36 ms
queued and flushed once; the in-transaction request was slower with
psycopg's pipeline (488 requests/s at 4 clients) than without (819).

What psycopg does for a statement is kept: its adapters dump the
parameters and load the rows (psycopg.adapt.Transformer), an error is
psycopg's exception for its SQLSTATE (psycopg.errors.error_from_result),
and the connection's lock is held for the flight. The statements are the
runner's own, with %s placeholders, or %(name)s ones and a dict of
parameters (the claims').
"""

import asyncio
import itertools
import re
import select
import weakref

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

from ._ops import Query

_BAD = pq.ConnStatus.BAD
_FATAL = pq.ExecStatus.FATAL_ERROR
_TUPLES = pq.ExecStatus.TUPLES_OK
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_SQLSTATE = pq.DiagnosticField.SQLSTATE


def _positional(sql, params):
    """%(name)s placeholders and a dict as %s ones and a tuple in their order
    (a name used twice is sent twice)."""
    if not isinstance(params, dict):
        return sql, tuple(params or ())
    names = re.findall(r"%\((\w+)\)s", sql)
    return re.sub(r"%\((\w+)\)s", "%s", sql), tuple(params[n] for n in names)


def _numbered(sql, n):
    """psycopg's %s placeholders as the server's $1, $2, ..."""
    parts = sql.split("%s")
    if len(parts) != n + 1:
        raise psycopg.ProgrammingError("pg_idem: %d parameters for %d placeholders" % (n, len(parts) - 1))
    out = [parts[0]]
    for i, part in enumerate(parts[1:], 1):
        out.append("$%d" % i)
        out.append(part)
    return "".join(out)


# The statements each connection has prepared for its flights: {conn: {(sql, types): name}}.
_NAMES = weakref.WeakKeyDictionary()
_COUNTER = itertools.count(1)


def _prepares(conn, q):
    """Whether q goes as a named statement: psycopg would prepare it (its
    prepare is None and the connection prepares at all; the runner turns
    that off behind a pooler), at its first use here, as the C++ client's
    pipeline does."""
    return q.prepare is None and conn.prepare_threshold is not None


def flight(conn, queries):
    """The I/O of one flight, as a generator: it yields "r" or "w" when it
    needs the socket readable or writable, and returns the first row (or
    None) of each statement; raises the first statement's error. The
    caller holds conn.lock and waits on conn.pgconn.socket.

    A statement this connection prepared may be gone (psycopg sends
    DEALLOCATE ALL after a ROLLBACK it sees, a session pooler DISCARD ALL):
    a flight that opened its transaction then is rolled back and sent
    again, preparing anew; nothing else ran in that transaction."""
    try:
        return (yield from _one(conn, queries))
    except psycopg.errors.InvalidSqlStatementName:
        if not queries[0].sql.startswith("BEGIN") or conn.broken:
            raise
    yield from _one(conn, [Query(conn, "ROLLBACK", None, False)])
    return (yield from _one(conn, queries))


def _one(conn, queries):
    pg = conn.pgconn
    encoding = conn.info.encoding
    tx = Transformer.from_context(conn)
    names = _NAMES.setdefault(conn, {})
    parses = []   # per statement: (key, name) when this flight prepares it, else None
    pg.enter_pipeline_mode()
    try:
        for q in queries:
            text, params = _positional(q.sql, q.params)
            values = types = formats = None
            if params:
                values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
                types, formats = tx.types, tx.formats
            sql = _numbered(text, len(params)).encode(encoding)
            parses.append(None)
            if not _prepares(conn, q):
                pg.send_query_params(sql, values, types, formats)
                continue
            key = (sql, types)
            name = names.get(key)
            if name is None:
                name = ("pg_idem_flight_%d" % next(_COUNTER)).encode()
                pg.send_prepare(name, sql, types)
                parses[-1] = (key, name)
            pg.send_query_prepared(name, values, formats)
        pg.pipeline_sync()
        while pg.flush():
            yield "w"
        results = []
        while True:
            if pg.status == _BAD:
                raise psycopg.OperationalError("pg_idem: the connection was lost: %s"
                                               % pg.error_message.decode(encoding, "replace"))
            if pg.is_busy():
                yield "r"
                pg.consume_input()
                continue
            r = pg.get_result()
            if r is None:
                continue  # the end of one statement's results
            if r.status == _SYNC:
                break
            results.append(r)
    finally:
        if pg.status != _BAD:
            pg.exit_pipeline_mode()
    # A Parse's result comes before its statement's; a failed Parse (or one
    # after an error) leaves the statement's result aborted behind it.
    rows, at = [], 0
    for parse in parses:
        if parse is not None:
            if results[at].status == _FATAL:
                raise psycopg.errors.error_from_result(results[at], encoding=encoding)
            names[parse[0]] = parse[1]
            at += 1
        r = results[at]
        at += 1
        if r.status == _FATAL:
            if r.error_field(_SQLSTATE) == b"26000":
                names.clear()  # DEALLOCATE ALL or DISCARD ALL on this session: prepare again
            raise psycopg.errors.error_from_result(r, encoding=encoding)
        if r.status == _TUPLES and r.ntuples:
            tx.set_pgresult(r)
            rows.append(tx.load_row(0, tuple))
        else:
            rows.append(None)
    return rows


def _wait(fd, want):
    if hasattr(select, "poll"):
        p = select.poll()
        p.register(fd, select.POLLIN if want == "r" else select.POLLOUT)
        p.poll()
    else:  # Windows
        select.select([fd] if want == "r" else [], [fd] if want == "w" else [], [])


def send(conn, queries):
    """A flight on a blocking psycopg.Connection."""
    with conn.lock:
        fd, gen = conn.pgconn.socket, flight(conn, queries)
        try:
            want = next(gen)
            while True:
                _wait(fd, want)
                want = gen.send(None)
        except StopIteration as stop:
            return stop.value


async def send_async(conn, queries):
    """A flight on a psycopg.AsyncConnection: its socket waited on by the event loop."""
    loop = asyncio.get_running_loop()
    async with conn.lock:
        fd, gen = conn.pgconn.socket, flight(conn, queries)
        try:
            want = next(gen)
            while True:
                ready = loop.create_future()
                add, remove = ((loop.add_reader, loop.remove_reader) if want == "r"
                               else (loop.add_writer, loop.remove_writer))
                add(fd, lambda: ready.done() or ready.set_result(None))
                try:
                    await ready
                finally:
                    remove(fd)
                want = gen.send(None)
        except StopIteration as stop:
            return stop.value
