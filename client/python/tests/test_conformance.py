"""The conformance test the three clients run: client/conformance/protocol.json
(generated from extension/protocol/protocol.toml) says, for every claim
outcome in every profile, what a client does and answers; how a handler's
status is stored; the cache-key and request-hash vectors and the key
statuses' sentences; the client defaults and limits, the namespace's place
in the key, the replay headers, the metrics' series and events and the
profiles' names. The Python client must agree with every line."""

import json
import os

import pytest

import pg_idem
from pg_idem import Config, ConfigError, HeaderAllowlist, Request, cache_key, classify, request_hash
from pg_idem import _checks, protocol
from pg_idem._engine import Engine, RunResult, _Call
from pg_idem._statements import Row
from pg_idem.key import KeyStatus, describe

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC_PATH = os.path.join(HERE, "..", "..", "conformance", "protocol.json")

with open(SPEC_PATH, encoding="utf-8") as f:
    SPEC = json.load(f)


def row_for(outcome):
    """The row a server sends with this outcome (a stored response where one comes with it)."""
    o = protocol.OUTCOMES[outcome]
    status = 201 if o.response else None
    return Row(outcome, "00000000-0000-0000-0000-000000000001" if o.role == "win" else None, 1,
               0.5 if outcome in ("cooldown", "in_progress") else None, status,
               '{"content-type": "application/json"}' if outcome == "replay" else None,
               b'{"ok": true}' if outcome == "replay" else None)


def answer_of(engine, call, row, action):
    """What the engine answers for the row: the follower's answer, or for
    wait the answer once the wait budget is spent."""
    got = engine.on_row(call, row)
    if action == "wait":
        assert got == "wait"
        return engine.timed_out(call)
    return got


@pytest.mark.parametrize("case", SPEC["outcomes"], ids=lambda c: "%s-%s" % (c["outcome"], c["profile"]))
def test_every_outcome_in_every_profile(case):
    engine = Engine(Config(profile=case["profile"]))
    call = _Call(engine.cfg, Request("alice", "POST", "/conformance", ["k"], b"{}"))
    row = row_for(case["outcome"])
    action = case["action"]
    if action == "run":
        assert row.won, case
        return
    if action == "claim":
        assert not row.won and engine.on_row(call, row) == "claim", case
        return
    res = answer_of(engine, call, row, action)
    assert isinstance(res, RunResult), case
    assert res.outcome == case["result"], case
    r = res.response
    if action == "replay":
        assert r.status == 201 and r.body == b'{"ok": true}' and r.header("Idempotent-Replayed") == "true"
        return
    body = json.loads(r.body)
    assert r.status == case["status"] and body["status"] == case["status"], case
    assert body["type"] == case["type"], case
    assert r.header("Content-Type") == "application/problem+json"
    assert (r.header("Retry-After") is not None) == case["retry_after"], case


def test_every_outcome_and_profile_is_covered():
    names = {(c["outcome"], c["profile"]) for c in SPEC["outcomes"]}
    assert names == {(o, p) for o in protocol.OUTCOMES for p in protocol.PROFILES}


@pytest.mark.parametrize("case", SPEC["storage"], ids=lambda c: str(c["status"]))
def test_storage_of_every_status(case):
    assert classify(case["status"]) == case["action"]


@pytest.mark.parametrize("case", SPEC["key_vectors"], ids=lambda c: c["cache_key"][:8])
def test_cache_key_vectors(case):
    assert cache_key(case["principal"], case["method"], case["target"], case["key"]).hex() == case["cache_key"]


@pytest.mark.parametrize("case", SPEC["request_hash_vectors"], ids=lambda c: c["request_hash"][:8])
def test_request_hash_vectors(case):
    assert request_hash(case["body"].encode("utf-8")).hex() == case["request_hash"]


def test_client_defaults():
    """The oldest extension and the validation statuses are the protocol's,
    as in the other clients: released by default, stored with client_errors="store"."""
    spec = SPEC["client"]
    assert protocol.OLDEST_EXTENSION == spec["oldest_extension"]
    assert _checks.OLDEST_EXTENSION == spec["oldest_extension"]
    assert spec["validation_statuses"]
    for s in spec["validation_statuses"]:
        assert classify(s) == "finalize", s
        assert Engine(Config()).classify(s) == "release", s
        assert Engine(Config(client_errors="store")).classify(s) == "finalize", s
    assert Engine(Config()).classify(404) == "finalize"  # only those


def test_key_status_sentences():
    assert {s.value: describe(s) for s in KeyStatus} == SPEC["key_statuses"]


def test_the_server_computes_the_same_keys(db):
    """The vectors against the server's idem_key (as sql/key_vectors.sql does)."""
    for v in SPEC["key_vectors"]:
        got = db.execute("SELECT encode(idem_key(%s, %s, %s, %s), 'hex')",
                         (v["principal"], v["method"], v["target"], v["key"])).fetchone()[0]
        assert got == v["cache_key"], v
    for v in SPEC["request_hash_vectors"]:
        got = db.execute("SELECT encode(idem_request_hash(%s::bytea), 'hex')",
                         (v["body"].encode("utf-8"),)).fetchone()[0]
        assert got == v["request_hash"], v


def test_client_defaults_and_limits():
    """Config() is protocol.json's defaults (in seconds), and refuses what its limits refuse."""
    d, lim = SPEC["client"]["defaults"], SPEC["client"]["limits"]
    c = Config()
    ms = {"lease": "lease_ms", "follower_wait_budget": "follower_wait_budget_ms", "poll_min": "poll_min_ms",
          "poll_max": "poll_max_ms", "retry_after": "retry_after_ms", "failure_cooldown": "failure_cooldown_ms"}
    for name, key in ms.items():
        assert getattr(c, name) == d[key] / 1000.0, name
    for name in ("poll_jitter", "max_request_body_bytes", "max_cacheable_response_bytes", "max_iterations",
                 "transaction_attempts", "profile", "client_errors"):
        assert getattr(c, name) == d[name], name
    assert c.renew_interval == c.lease / d["renew_divisor"]
    from pg_idem import _engine
    assert _engine.WAIT_SLICE == d["wait_slice_ms"] / 1000.0
    assert Config(lease=lim["min_lease_ms"] / 1000.0, renew_interval=0.001).lease == lim["min_lease_ms"] / 1000.0
    for bad in (lim["min_lease_ms"] / 2000.0, lim["max_lease_ms"] / 1000.0 + 1):
        with pytest.raises(ConfigError, match="lease"):
            Config(lease=bad)
    for how in lim["client_errors"]:
        assert Config(client_errors=how).client_errors == how
    with pytest.raises(ConfigError, match="client_errors"):
        Config(client_errors="keep")


def test_profiles_and_their_old_names():
    assert list(protocol.PROFILES) == SPEC["profiles"]
    for p in SPEC["profiles"]:
        assert Config(profile=p).profile == p
    for old, new in SPEC["deprecated_profiles"].items():
        with pytest.warns(DeprecationWarning, match=new["until"]):
            assert Config(profile=old).profile == new["profile"]
        with pytest.warns(DeprecationWarning):
            assert getattr(pg_idem, old.upper()) == new["profile"]


@pytest.mark.parametrize("case", SPEC["namespace_vectors"], ids=lambda c: str(c["namespace"]))
def test_namespace_goes_where_the_protocol_says(case):
    """The runner's key with Config(namespace=...) is the vector's."""
    cfg = Config(namespace=case["namespace"])
    call = _Call(cfg, Request(case["principal"], case["method"], case["target"], [case["key"]], b"{}"))
    assert call.ck.hex() == case["cache_key"]
    assert protocol.namespaced_target(case["namespace"], case["target"]) == case["namespaced_target"]


def test_replay_headers():
    rh = SPEC["replay_headers"]
    assert pg_idem.REPLAY_HEADER == rh["replayed_header"]
    default = HeaderAllowlist()
    for v in rh["vectors"]:
        assert default.allows(v["name"]) == v["by_default"], v
        assert HeaderAllowlist([v["name"]]).allows(v["name"]) == v["when_configured"], v
        assert pg_idem.is_never_stored(v["name"]) == (not v["when_configured"]), v
        if not v["when_configured"]:
            with pytest.raises(ConfigError, match="never stored"):
                Config(replay_headers=[v["name"]])


def test_metrics_series_and_events():
    from pg_idem.metrics import EVENTS
    assert list(EVENTS) == SPEC["events"]
    prometheus_client = pytest.importorskip("prometheus_client")
    from pg_idem.metrics import PrometheusMetrics
    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(registry)
    families = {m.name: m for m in registry.collect()}
    for kind, values in (("requests", list(protocol.CLIENT_OUTCOMES)), ("events", SPEC["events"])):
        series = SPEC["metrics"][kind]
        family = families[series["name"]]
        assert family.documentation == series["help"]
        samples = {s.labels[series["label"]] for s in family.samples if s.name == series["name"] + "_total"}
        assert samples == set(values), kind


def test_inbox_answers_results_and_broker_actions():
    from pg_idem.inbox import Inbox, InboxResult, _answer
    from pg_idem.outbox import BatchReport
    m = SPEC["messaging"]
    for a in m["inbox_answers"]:
        assert protocol.INBOX_RESULT_OF[_answer(a["name"])] == a["result"]
    with pytest.raises(RuntimeError):
        _answer("no such answer")
    assert [(r["name"], r["broker"]) for r in m["inbox_results"]] == [
        (o.value, InboxResult(outcome=o).broker_action.value) for o in protocol.InboxOutcome]
    assert Inbox("dbname=unused").settings.max_attempts == m["inbox"]["default_max_attempts"]
    assert protocol.INBOX_MAX_ATTEMPTS == m["inbox"]["max_attempts"]
    assert [n["name"] for n in m["nack_outcomes"]] == [o.value for o in protocol.NackOutcome]
    assert list(BatchReport().as_dict()) == m["relay_counts"]
    assert {n["name"]: n["count"] for n in m["nack_outcomes"]} == {k.value: v for k, v in protocol.NACK_COUNT.items()}
