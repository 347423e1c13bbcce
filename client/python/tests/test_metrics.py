"""The metrics hook (issue 22): prometheus_client counters with the C++
client's series names, every outcome and event at zero from the start, and
a winner, its duplicates and a store error counted."""

import uuid

import pytest

from pg_idem import Request, Response, Runner
from pg_idem.metrics import EVENTS


def sample(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_runs_are_counted_with_the_cpp_series_names(dsn):
    prometheus_client = pytest.importorskip("prometheus_client")
    from pg_idem.metrics import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'idem_client_requests_total{outcome="expired"} 0.0' in text
    for e in EVENTS:
        assert 'idem_client_events_total{event="%s"} 0.0' % e in text

    runner = Runner(dsn, metrics=metrics)
    k = str(uuid.uuid4())
    r = Request("alice", "POST", "/metrics", [k], b"{}")
    for _ in range(3):
        runner.run(r, lambda claim: Response(201, [], b"ok"))
    runner.run(Request("alice", "POST", "/metrics", [k], b"other"), lambda claim: Response(201))
    runner.run(Request("alice", "POST", "/metrics", [], b"{}"), lambda claim: Response(201))
    assert sample(registry, "idem_client_requests_total", outcome="won_completed") == 1
    assert sample(registry, "idem_client_requests_total", outcome="replay") == 2
    assert sample(registry, "idem_client_requests_total", outcome="conflict") == 1
    assert sample(registry, "idem_client_requests_total", outcome="unguarded") == 1
    assert sample(registry, "idem_client_events_total", event="claimed") == 1
    assert sample(registry, "idem_client_events_total", event="finalized") == 1

    down = Runner("host=127.0.0.1 port=1 connect_timeout=2", metrics=metrics)
    down.run(Request("alice", "POST", "/metrics", [k], b"{}"), lambda claim: Response(201))
    assert sample(registry, "idem_client_requests_total", outcome="failed") == 1


def test_two_hooks_on_one_registry_share_the_series():
    prometheus_client = pytest.importorskip("prometheus_client")
    from pg_idem.metrics import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    a, b = PrometheusMetrics(registry), PrometheusMetrics(registry)
    a.on_outcome("replay")
    b.on_outcome("replay")
    assert sample(registry, "idem_client_requests_total", outcome="replay") == 2
