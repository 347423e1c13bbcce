"""Prometheus counters for the runner, with the protocol's series names
(protocol.toml's [metrics], the same in every client), so that one
dashboard serves every client:

    idem_client_requests_total{outcome}  one per run (RunResult.outcome)
    idem_client_events_total{event}      the claim's lifecycle events
    and the inbox consumer's and outbox relay's (names in protocol.py):
    idem_client_inbox_messages_total{outcome}  one per delivery (InboxResult.outcome)
    idem_client_outbox_events_total{result}    a relay's batch counts (BatchReport)

    from pg_idem.metrics import PrometheusMetrics
    app.add_middleware(IdempotencyMiddleware, dsn=..., principal=..., metrics=PrometheusMetrics())
    # and expose prometheus_client's registry (make_asgi_app(), start_http_server(...))

Needs prometheus_client (Debian: python3-prometheus-client; pip: the
"metrics" extra). Every series is there from the start, at zero, so that
rate() sees each one."""

from . import protocol

# The claim's lifecycle events, the protocol's (the same in every client).
EVENTS = protocol.EVENTS


_REGISTERED = {}


def _counters(registry):
    """The two counters of a registry, made once: a second PrometheusMetrics
    (two apps in one process, a reload) counts into the same series instead
    of failing with "Duplicated timeseries"."""
    import prometheus_client

    registry = prometheus_client.REGISTRY if registry is None else registry
    if id(registry) not in _REGISTERED:
        req, ev = protocol.METRICS["requests"], protocol.METRICS["events"]
        requests = prometheus_client.Counter(req.name, req.help, [req.label], registry=registry)
        events = prometheus_client.Counter(ev.name, ev.help, [ev.label], registry=registry)
        for name in protocol.CLIENT_OUTCOMES:
            requests.labels(name)
        for name in EVENTS:
            events.labels(name)
        inbox = _labelled(prometheus_client, registry, protocol.INBOX_METRIC, protocol.INBOX_METRIC_HELP,
                          protocol.INBOX_METRIC_LABEL, [o.value for o in protocol.InboxOutcome])
        relay = _labelled(prometheus_client, registry, protocol.RELAY_METRIC, protocol.RELAY_METRIC_HELP,
                          protocol.RELAY_METRIC_LABEL, protocol.RELAY_COUNTS)
        _REGISTERED[id(registry)] = (registry, requests, events, inbox, relay)
    return _REGISTERED[id(registry)][1:]


def _labelled(prometheus_client, registry, name, help_text, label, values):
    """A counter with one series per value, each at zero."""
    counter = prometheus_client.Counter(name[:-len("_total")] if name.endswith("_total") else name, help_text,
                                        [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class PrometheusMetrics:
    """on_outcome / on_event for pg_idem.Runner, AsyncRunner and the
    middleware (metrics=); registry: prometheus_client's (the default one
    unless given)."""

    def __init__(self, registry=None):
        self.requests, self.events, self.inbox, self.relay = _counters(registry)

    def on_outcome(self, outcome):
        self.requests.labels(outcome).inc()

    def on_event(self, event):
        self.events.labels(event).inc()

    def on_inbox(self, outcome):
        """pg_idem.inbox: one delivery's outcome."""
        self.inbox.labels(outcome).inc()

    def on_relay(self, report):
        """pg_idem.outbox: one batch's counts (a BatchReport)."""
        for name, n in report.as_dict().items():
            if n:
                self.relay.labels(name).inc(n)
