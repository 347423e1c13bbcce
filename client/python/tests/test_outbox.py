"""The outbox relay (pg_idem.outbox) against the real server: the C++
client's drainer tests (client/cpp/tests/integration_messages_test.cpp)
and the asyncio twin. Each test starts from an empty outbox."""

import asyncio
import threading
import time

import psycopg
import pytest

from pg_idem import protocol
from pg_idem.outbox import ABANDON_REST, AsyncDrainer, BatchReport, Drainer
from pg_idem.runner import SimplePool


@pytest.fixture
def outbox_dsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM idem_outbox")
    return dsn


def with_options(dsn, options):
    return dsn + " options='%s'" % options


def stage(dsn, topic, n, keys=()):
    with psycopg.connect(dsn) as c:
        ids = [c.execute("SELECT idem_outbox_stage(%s, jsonb_build_object('seq', %s::int), %s)",
                         (topic, i, keys[i % len(keys)] if keys else None)).fetchone()[0] for i in range(n)]
    return ids


def one(dsn, sql, *params):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, params).fetchone()


def eventually(check, timeout=30):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.01)
    return check()


def test_relays_publish_every_event_once_in_per_key_order(outbox_dsn):
    keys = ["k%d" % i for i in range(8)]
    staged = []
    for _ in range(4):
        staged += stage(outbox_dsn, "orders", 40, keys) + stage(outbox_dsn, "orders", 10)
    log, lock = [], threading.Lock()

    def publish(e):
        if e.id % 7 == 0:
            time.sleep(0.001)
        with lock:
            log.append((e.id, e.key, e.payload))
    pool = SimplePool(outbox_dsn, max_size=8)
    drainers = [Drainer(pool, publish, batch=16, idle_wait=0.2) for _ in range(3)]
    threads = [threading.Thread(target=d.run) for d in drainers]
    for t in threads:
        t.start()
    everything = eventually(lambda: len(log) >= len(staged))
    time.sleep(0.05)  # a duplicate would show up now
    for d in drainers:
        d.stop()
    for t in threads:
        t.join()
    assert everything, "published %d of %d" % (len(log), len(staged))
    ids = [i for i, _, _ in log]
    assert sorted(ids) == sorted(staged) and len(set(ids)) == len(ids)
    last = {}
    for i, key, payload in log:
        assert payload.startswith('{"seq": ')
        if key is not None:
            assert i > last.get(key, 0), "key %s out of order" % key
            last[key] = i
    total = BatchReport()
    for d in drainers:
        total += d.totals()
    assert total.acked == len(staged) and total.lease_lost == 0
    assert one(outbox_dsn, "SELECT count(*) FROM idem_outbox WHERE state = 'published' AND topic = 'orders'")[0] \
        == len(staged)


def test_failing_publisher_is_retried_after_backoff_then_dead(outbox_dsn):
    pool = SimplePool(with_options(outbox_dsn, "-c idem.outbox_backoff=1s -c idem.outbox_max_attempts=3"))
    ids = stage(outbox_dsn, "payments", 1)
    calls = []

    def publish(e):
        calls.append(e.attempts)
        raise ConnectionError("broker down")
    d = Drainer(pool, publish)
    b1 = d.drain_once()
    assert (b1.claimed, b1.retried) == (1, 1)
    assert d.drain_once().claimed == 0  # backing off
    time.sleep(1.1)
    assert d.drain_once().retried == 1
    time.sleep(1.1)
    assert d.drain_once().dead == 1
    assert calls == [1, 2, 3]
    assert one(outbox_dsn, "SELECT state, attempts, last_error FROM idem_outbox WHERE id = %s", ids[0]) == (
        "dead", 3, "broker down")
    time.sleep(1.1)
    assert d.drain_once().claimed == 0  # dead: never again


def test_failed_event_holds_its_key_until_it_is_published(outbox_dsn):
    pool = SimplePool(with_options(outbox_dsn, "-c idem.outbox_backoff=1s"))
    ids = stage(outbox_dsn, "payments", 3, ["acct-1"])
    published = []

    def publish(e):
        if not published and not getattr(publish, "failed", False):
            publish.failed = True
            raise TimeoutError("timeout talking to the broker")
        published.append(e.id)
    d = Drainer(pool, publish)
    assert d.drain_once().retried == 1
    assert d.drain_once().claimed == 0  # the key's later events wait behind the failed one
    assert one(outbox_dsn, "SELECT last_error FROM idem_outbox WHERE id = %s", ids[0])[0] \
        == "timeout talking to the broker"
    assert eventually(lambda: d.drain_once() and len(published) == 3)
    assert published == ids


def test_stop_interrupts_the_idle_wait(outbox_dsn):
    pool = SimplePool(outbox_dsn)
    d = Drainer(pool, lambda e: None, idle_wait=30)
    t = threading.Thread(target=d.run)
    t.start()
    assert eventually(lambda: one(outbox_dsn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                                              " AND query LIKE '%%idem_outbox_wait%%' AND pid <> pg_backend_pid()")[0])
    asked = time.monotonic()
    d.stop()
    t.join()
    assert time.monotonic() - asked < 0.6  # the cancel request ends it, not the end of the slice
    assert d.stop_requested and len(pool._idle) == 1


@pytest.mark.parametrize("mode", ["finish_batch", "abandon_rest"])
def test_stop_finishes_the_batch_or_abandons_the_rest(outbox_dsn, mode):
    stage(outbox_dsn, "exports", 6)
    published = []

    def publish(e):
        if not published:
            d.stop()  # stop() arrives during the first publish
        published.append(e.id)
        time.sleep(0.01)
    d = Drainer(outbox_dsn, publish, lease=2.0, on_stop=mode)  # the abandoned rest stays leased while a slow machine looks
    d.run()
    t = d.totals()
    assert t.claimed == 6
    if mode == "finish_batch":
        assert t.acked == 6
        return
    assert (t.acked, t.abandoned) == (1, 5)
    again = Drainer(outbox_dsn, lambda e: None)
    assert again.drain_once().claimed == 0
    time.sleep(2.1)  # the rest comes back once the lease runs out
    b = again.drain_once()
    assert (b.claimed, b.acked) == (5, 5)


def test_ack_after_the_lease_was_taken_over_is_reported(outbox_dsn):
    stage(outbox_dsn, "slow", 1)
    entered, release = threading.Event(), threading.Event()

    def slow_publish(e):
        entered.set()
        release.wait(30)
    slow = Drainer(outbox_dsn, slow_publish, lease=1.5, lease_margin=0)  # a slow claim still leaves the publish its lease
    late = []
    t = threading.Thread(target=lambda: late.append(slow.drain_once()))
    t.start()
    assert entered.wait(10), "the slow relay never published"
    time.sleep(1.6)  # the lease runs out while the slow relay publishes; another takes over
    b = Drainer(outbox_dsn, lambda e: None).drain_once()
    assert (b.claimed, b.acked) == (1, 1)
    release.set()
    t.join()
    assert (late[0].published, late[0].acked, late[0].lease_lost) == (1, 0, 1)
    assert one(outbox_dsn, "SELECT count(*) FROM idem_outbox_archive")[0] == 1


def test_asyncio_twin(outbox_dsn):
    ids = stage(outbox_dsn, "async", 20, ["a", "b"])

    async def main():
        seen = []

        async def publish(e):
            await asyncio.sleep(0)
            seen.append(e.id)
        d = AsyncDrainer(outbox_dsn, publish, batch=7, idle_wait=30)
        task = asyncio.ensure_future(d.run())
        while len(seen) < len(ids):
            await asyncio.sleep(0.01)
        asked = time.monotonic()
        d.stop()
        await task
        return seen, time.monotonic() - asked, d.totals()
    seen, took, total = asyncio.run(main())
    assert sorted(seen) == ids and took < 0.6 and total.acked == 20


def test_batches_are_counted(outbox_dsn):
    prometheus_client = pytest.importorskip("prometheus_client")
    from pg_idem.metrics import PrometheusMetrics
    registry = prometheus_client.CollectorRegistry()
    stage(outbox_dsn, "counted", 3, ["x"])

    def publish(e):
        raise OSError("no route to broker")
    reports = []
    Drainer(outbox_dsn, publish, metrics=PrometheusMetrics(registry), on_batch=reports.append).drain_once()
    value = lambda r: registry.get_sample_value(protocol.RELAY_METRIC, {"result": r})  # noqa: E731
    assert [value(n) for n in ("claimed", "retried", "published", "acked")] == [1, 1, 0, 0]
    assert reports == [BatchReport(claimed=1, retried=1)]


def test_bad_settings_are_refused(outbox_dsn):
    for bad in (dict(batch=0), dict(lease=0), dict(lease=1, lease_margin=1), dict(idle_wait=0),
                dict(on_stop="later"), dict(max_error_bytes=4)):
        with pytest.raises(ValueError):
            Drainer(outbox_dsn, lambda e: None, **bad)
    with pytest.raises(TypeError):
        Drainer(outbox_dsn, None)

    async def coroutine(e):
        pass
    with pytest.raises(TypeError):
        Drainer(outbox_dsn, coroutine)
    assert ABANDON_REST == "abandon_rest"
