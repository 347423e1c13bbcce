"""The inbox consumer (pg_idem.inbox) against the real server: the C++
client's inbox tests (client/cpp/tests/integration_messages_test.cpp),
the with-block form and the asyncio twin."""

import asyncio
import threading
import uuid

import psycopg
import pytest

from pg_idem import protocol
from pg_idem.aio import AsyncSimplePool
from pg_idem.inbox import AsyncInbox, BrokerAction, Inbox, InboxOutcome
from pg_idem.runner import SimplePool


@pytest.fixture(scope="module")
def msg_dsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS msg_effects (key text, note text)")
        c.execute("CREATE TABLE IF NOT EXISTS msg_deferred (k int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
        c.execute("CREATE TABLE IF NOT EXISTS msg_gated (key text)")
        # COMMIT of a msg_gated row waits at an advisory lock the test holds.
        c.execute("""CREATE OR REPLACE FUNCTION msg_gate() RETURNS trigger LANGUAGE plpgsql AS
                     $$BEGIN PERFORM pg_advisory_xact_lock(4243, 2); RETURN NULL; END$$""")
        c.execute("DROP TRIGGER IF EXISTS msg_gate ON msg_gated")
        c.execute("""CREATE CONSTRAINT TRIGGER msg_gate AFTER INSERT ON msg_gated
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION msg_gate()""")
    return dsn


def one(dsn, sql, *params):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, params).fetchone()


def effects(dsn, key):
    return one(dsn, "SELECT count(*) FROM msg_effects WHERE key = %s", key)[0]


def insert_effect(key):
    return lambda conn: conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (key,))


def mid():
    return "m-" + str(uuid.uuid4())


def test_processes_once_then_answers_duplicate(msg_dsn):
    pool = SimplePool(msg_dsn)
    inbox = Inbox(pool)
    m = mid()
    first = inbox.handle("billing", m, b'{"n":1}', insert_effect(m))
    assert first.outcome == InboxOutcome.PROCESSED == "processed"
    assert first.handler_ran and first.handler_runs == 1 and first.broker_action == BrokerAction.ACK
    assert effects(msg_dsn, m) == 1
    assert one(msg_dsn, "SELECT state FROM idem_inbox WHERE consumer = 'billing' AND message_id = %s", m)[0] == "done"
    again = inbox.handle("billing", m, b'{"n":1}', insert_effect(m))
    assert again.outcome == InboxOutcome.DUPLICATE and not again.handler_ran
    # Another consumer of the same message processes it for itself.
    assert inbox.handle("audit", m, b'{"n":1}', insert_effect(m)).outcome == InboxOutcome.PROCESSED
    assert effects(msg_dsn, m) == 2
    assert len(pool._idle) >= 1  # the connections went back idle


def test_handler_failure_is_recorded_with_retry_after(msg_dsn):
    inbox = Inbox(msg_dsn)
    m = mid()

    def failing(conn):
        conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
        raise RuntimeError("payment provider said no")
    r = inbox.handle("billing", m, "p", failing)
    assert r.outcome == InboxOutcome.RETRY and r.error_count == 1
    assert r.retry_after == 1.0  # idem.inbox_backoff_base
    assert r.broker_action == BrokerAction.REQUEUE_AFTER
    assert isinstance(r.error, RuntimeError)
    assert effects(msg_dsn, m) == 0  # the handler's write rolled back
    assert one(msg_dsn, "SELECT state, error_count, last_error FROM idem_inbox WHERE message_id = %s", m) == (
        "failed", 1, "payment provider said no")
    second = inbox.handle("billing", m, "p", insert_effect(m))
    assert second.outcome == InboxOutcome.PROCESSED and effects(msg_dsn, m) == 1


def test_cap_makes_the_message_dead_with_a_dead_letter(msg_dsn):
    inbox = Inbox(msg_dsn, max_attempts=2)
    m = mid()

    def poison(conn):
        raise ValueError("poison")
    r1 = inbox.handle("billing", m, "p", poison)
    assert (r1.outcome, r1.error_count) == (InboxOutcome.RETRY, 1)
    r2 = inbox.handle("billing", m, "p", poison)
    assert (r2.outcome, r2.error_count, r2.retry_after) == (InboxOutcome.DEAD, 2, 0.0)
    assert r2.broker_action == BrokerAction.ACK
    assert one(msg_dsn, "SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
                        " AND payload ->> 'message_id' = %s AND payload ->> 'last_error' = 'poison'", m)[0] == 1
    r3 = inbox.handle("billing", m, "p", insert_effect(m))
    assert r3.outcome == InboxOutcome.DEAD and not r3.handler_ran and effects(msg_dsn, m) == 0


def test_same_id_with_another_payload_is_a_mismatch(msg_dsn):
    inbox = Inbox(msg_dsn)
    m = mid()
    assert inbox.handle("billing", m, "first", insert_effect(m)).outcome == InboxOutcome.PROCESSED
    r = inbox.handle("billing", m, "second", insert_effect(m))
    assert r.outcome == InboxOutcome.MISMATCH and not r.handler_ran and effects(msg_dsn, m) == 1


def test_concurrent_deliveries_have_one_effect(msg_dsn):
    inbox = Inbox(SimplePool(msg_dsn, max_size=6))
    m = mid()
    barrier = threading.Barrier(6)
    results = []

    def handler(conn):
        conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
        threading.Event().wait(0.05)  # keep the others waiting on the message

    def deliver():
        barrier.wait()
        results.append(inbox.handle("billing", m, "payload", handler).outcome)
    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted([InboxOutcome.PROCESSED] + [InboxOutcome.DUPLICATE] * 5)
    assert effects(msg_dsn, m) == 1


def test_serialization_failure_in_the_handler_is_rerun_in_place(msg_dsn):
    inbox = Inbox(msg_dsn)
    m = mid()
    runs = []

    def handler(conn):
        runs.append(1)
        conn.execute("INSERT INTO msg_effects (key, note) VALUES (%s, %s)", (m, str(len(runs))))
        if len(runs) == 1:
            conn.execute("DO $$BEGIN RAISE EXCEPTION 'simulated conflict' USING ERRCODE = 'serialization_failure'; END$$")
    r = inbox.handle("billing", m, "p", handler)
    assert r.outcome == InboxOutcome.PROCESSED and r.handler_runs == 2
    assert one(msg_dsn, "SELECT count(*) FROM msg_effects WHERE key = %s AND note = '2'", m)[0] == 1
    assert effects(msg_dsn, m) == 1
    assert one(msg_dsn, "SELECT error_count FROM idem_inbox WHERE message_id = %s", m)[0] == 0

    m2 = mid()
    r2 = inbox.handle("billing", m2, "p", lambda conn: conn.execute(
        "DO $$BEGIN RAISE EXCEPTION 'simulated conflict' USING ERRCODE = 'serialization_failure'; END$$"))
    assert (r2.outcome, r2.handler_runs, r2.error_count) == (InboxOutcome.RETRY, 3, 1)
    assert isinstance(r2.error, psycopg.errors.SerializationFailure)


def test_failed_commit_is_recorded_in_autocommit(msg_dsn):
    pool = SimplePool(msg_dsn, max_size=1)
    inbox = Inbox(pool)
    m = mid()
    k = abs(hash(m)) % 2 ** 30

    def handler(conn):
        conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
        conn.execute("INSERT INTO msg_deferred VALUES (%s), (%s)", (k, k))
    r = inbox.handle("billing", m, "p", handler)
    assert (r.outcome, r.error_count) == (InboxOutcome.RETRY, 1)
    assert isinstance(r.error, psycopg.errors.UniqueViolation)
    assert effects(msg_dsn, m) == 0
    assert one(msg_dsn, "SELECT state FROM idem_inbox WHERE message_id = %s", m)[0] == "failed"
    # The same (pooled) connection works, and nothing holds the message.
    assert inbox.handle("billing", m, "p", insert_effect(m)).outcome == InboxOutcome.PROCESSED
    assert effects(msg_dsn, m) == 1


def test_lost_commit_is_unknown_and_the_handler_is_not_rerun(msg_dsn):
    inbox = Inbox(msg_dsn)
    m = mid()
    runs = []
    with psycopg.connect(msg_dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(4243, 2)")
        out = []

        def handler(conn):
            runs.append(1)
            conn.execute("INSERT INTO msg_gated (key) VALUES (%s)", (m,))
        t = threading.Thread(target=lambda: out.append(inbox.handle("billing", m, "p", handler)))
        t.start()
        # Its COMMIT waits at the gate: end its session there.
        pid = None
        for _ in range(1000):
            row = gate.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4243"
                               " AND objid = 2 AND NOT granted").fetchone()
            if row:
                pid = row[0]
                break
            threading.Event().wait(0.01)
        assert pid, "the COMMIT never reached the gate"
        gate.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.join(30)
        gate.execute("SELECT pg_advisory_unlock(4243, 2)")
    r = out[0]
    assert r.outcome == InboxOutcome.UNKNOWN and r.broker_action == BrokerAction.REQUEUE
    assert len(runs) == 1 and r.error is not None
    # It did not commit: the redelivery processes it; the server counted the lost attempt.
    again = inbox.handle("billing", m, "p", insert_effect(m))
    assert again.outcome == InboxOutcome.PROCESSED
    assert one(msg_dsn, "SELECT count(*) FROM msg_gated WHERE key = %s", m)[0] == 0
    assert one(msg_dsn, "SELECT error_count FROM idem_inbox WHERE message_id = %s", m)[0] == 1


def test_bad_arguments_raise_before_the_handler(msg_dsn):
    inbox = Inbox(msg_dsn)
    ran = []
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        inbox.handle("", "m1", "p", lambda conn: ran.append(1))
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        inbox.handle("billing", "", "p", lambda conn: ran.append(1))
    assert not ran
    for bad in (dict(max_attempts=0), dict(max_attempts=protocol.INBOX_MAX_ATTEMPTS + 1),
                dict(handler_attempts=0), dict(isolation="chaos"), dict(max_error_bytes=1)):
        with pytest.raises(ValueError):
            Inbox(msg_dsn, **bad)


def test_the_with_block_is_the_handler(msg_dsn):
    inbox = Inbox(msg_dsn)
    m = mid()
    with inbox.message("billing", m, b"body") as d:
        assert d.process
        d.conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
    assert d.result.outcome == InboxOutcome.PROCESSED and d.outcome == "processed"
    with inbox.message("billing", m, b"body") as d:
        assert not d.process and d.conn is None
    assert d.result.outcome == InboxOutcome.DUPLICATE
    # An exception in the block is the attempt's failure: recorded, not raised.
    m2 = mid()
    with inbox.message("billing", m2, b"body") as d:
        d.conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m2,))
        raise KeyError("no such customer")
    assert d.result.outcome == InboxOutcome.RETRY and isinstance(d.result.error, KeyError)
    assert effects(msg_dsn, m2) == 0
    assert one(msg_dsn, "SELECT last_error FROM idem_inbox WHERE message_id = %s", m2)[0] == "'no such customer'"


def test_an_interrupt_in_the_block_propagates_and_is_counted(msg_dsn):
    pool = SimplePool(msg_dsn)
    inbox = Inbox(pool)
    m = mid()
    with pytest.raises(KeyboardInterrupt):
        with inbox.message("billing", m, b"body") as d:
            d.conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
            raise KeyboardInterrupt
    # The connection was closed: the server recorded the attempt as the session ended.
    for _ in range(500):
        row = one(msg_dsn, "SELECT state, error_count FROM idem_inbox WHERE message_id = %s", m)
        if row[0] != "processing":
            break
        threading.Event().wait(0.01)
    assert row == ("failed", 1) and effects(msg_dsn, m) == 0
    assert inbox.handle("billing", m, b"body", insert_effect(m)).outcome == InboxOutcome.PROCESSED


def test_asyncio_twin(msg_dsn):
    async def main():
        pool = AsyncSimplePool(msg_dsn)
        inbox = AsyncInbox(pool, max_attempts=2)
        m, bad = mid(), mid()

        async def handler(conn):
            await conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (m,))
        outs = await asyncio.gather(*[inbox.handle("billing", m, "p", handler) for _ in range(4)])
        async with inbox.message("billing", bad, "p") as d:
            assert d.process
            raise RuntimeError("async failure")
        failed = d.result
        async with inbox.message("billing", bad, "p") as d2:
            await d2.conn.execute("SELECT 1")
            raise RuntimeError("async failure")
        await pool.close()
        return outs, failed, d2.result, m
    outs, failed, dead, m = asyncio.run(main())
    assert sorted(o.outcome for o in outs) == sorted([InboxOutcome.PROCESSED] + [InboxOutcome.DUPLICATE] * 3)
    assert effects(msg_dsn, m) == 1
    assert (failed.outcome, failed.error_count) == (InboxOutcome.RETRY, 1)
    assert (dead.outcome, dead.error_count) == (InboxOutcome.DEAD, 2)


def test_outcomes_are_counted(msg_dsn):
    prometheus_client = pytest.importorskip("prometheus_client")
    from pg_idem.metrics import PrometheusMetrics
    registry = prometheus_client.CollectorRegistry()
    inbox = Inbox(msg_dsn, metrics=PrometheusMetrics(registry))
    m = mid()
    inbox.handle("billing", m, "p", insert_effect(m))
    inbox.handle("billing", m, "p", insert_effect(m))
    value = lambda o: registry.get_sample_value(protocol.INBOX_METRIC, {"outcome": o})  # noqa: E731
    assert value("processed") == 1 and value("duplicate") == 1 and value("dead") == 0
