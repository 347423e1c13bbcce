"""Unit tests without a database: keys, status matrix, allowlist, problems, configuration."""

import hashlib
import json
import struct

import pytest

import pg_idem

from pg_idem import (Config, ConfigError, HeaderAllowlist, InvalidKey, KeyStatus, Request, Response,
                     cache_key, check_key, check_key_header, classify, is_never_stored, problems,
                     request_hash)
from pg_idem._engine import Engine, parse_size_setting
from pg_idem.http import retry_after_seconds


def reference_key(*fields):
    h = hashlib.sha256(b"pg_idem key v1")
    for f in fields:
        raw = f.encode("utf-8")
        h.update(struct.pack(">I", len(raw)) + raw)
    return h.digest()


def test_cache_key_is_the_documented_tuple_digest():
    assert cache_key("alice", "POST", "/payments", "order-42") == reference_key("alice", "POST", "/payments", "order-42")
    assert len(cache_key("", "", "", "k")) == 32


def test_cache_key_is_length_delimited():
    assert cache_key("ab", "c", "/", "k") != cache_key("a", "bc", "/", "k")


def test_request_hash_is_sha256_of_the_body():
    assert request_hash(b"{}") == hashlib.sha256(b"{}").digest()
    assert request_hash("é") == hashlib.sha256("é".encode()).digest()
    assert request_hash(b"") == hashlib.sha256(b"").digest()


@pytest.mark.parametrize("key,status", [
    ("k", KeyStatus.OK), ("x" * 255, KeyStatus.OK), ("é" * 127, KeyStatus.OK),
    ("", KeyStatus.EMPTY), ("x" * 256, KeyStatus.TOO_LONG), ("é" * 128, KeyStatus.TOO_LONG),
    ("a\x00b", KeyStatus.CONTAINS_NUL), (b"\xc0\xaf", KeyStatus.INVALID_UTF8),
    (b"\xed\xa0\x80", KeyStatus.INVALID_UTF8), (b"\xf4\x90\x80\x80", KeyStatus.INVALID_UTF8),
    (b"\x80", KeyStatus.INVALID_UTF8), (b"\xe2\x82", KeyStatus.INVALID_UTF8), ("\ud800", KeyStatus.INVALID_UTF8),
    (b"\xf0\x9f\x92\xa9", KeyStatus.OK),
])
def test_key_validation(key, status):
    assert check_key(key) is status


def test_key_header_absent_and_repeated():
    assert check_key_header([]) is KeyStatus.ABSENT
    assert check_key_header(None) is KeyStatus.ABSENT
    assert check_key_header(["a", "a"]) is KeyStatus.DUPLICATED
    assert check_key_header(["a"]) is KeyStatus.OK


def test_cache_key_refuses_what_the_server_refuses():
    for bad in ("", "x" * 256, "a\x00", b"\xff"):
        with pytest.raises(InvalidKey):
            cache_key("p", "POST", "/", bad)


def test_status_matrix():
    for s in list(range(200, 300)) + [400, 404, 409, 422]:
        assert classify(s) == "finalize", s
    for s in list(range(500, 600)) + [408, 429, 0, 99, 600, 1000]:
        assert classify(s) == "fail", s
    for s in list(range(100, 200)) + list(range(300, 400)) + [401, 403, 405, 410, 413, 451]:
        assert classify(s) == "release", s


def test_never_stored_headers():
    for name in ("Set-Cookie", "set-cookie2", "Cookie", "Authorization", "Proxy-Authorization",
                 "WWW-Authenticate", "X-Session-Id", "X-Auth-Token", "X-CSRF-Token", "X-Api-Key"):
        assert is_never_stored(name), name
    assert not is_never_stored("Content-Type")


def test_allowlist_json():
    allow = HeaderAllowlist(["x-request-id"])
    text = allow.to_json([("Content-Type", "application/json"), ("Set-Cookie", "a=1"), ("X-Request-Id", "7"),
                          ("Cache-Control", "no-store"), ("cache-control", "private"), ("X-Other", "1"),
                          ("Location", "a\x00b")])
    assert json.loads(text) == {"content-type": "application/json", "x-request-id": "7",
                                "cache-control": "no-store, private"}
    assert not HeaderAllowlist(["set-cookie"]).allows("set-cookie")


def test_problem_details_per_profile():
    r = problems.in_progress("ietf", 0.2)
    assert r.status == 409 and r.header("Retry-After") == "1"
    assert r.header("content-type") == "application/problem+json"
    body = json.loads(r.body)
    assert body["status"] == 409 and body["type"].startswith("urn:pg-idem:problem:") and body["title"]
    assert problems.in_progress("conflict409", 1).status == 503
    assert problems.key_reused("ietf").status == 422
    assert problems.key_reused("conflict409").status == 409
    assert problems.cooldown("ietf", 1.5).header("Retry-After") == "2"
    assert problems.not_replayable("ietf").status == 409
    assert problems.expired("ietf").status == 410
    assert problems.missing_key("ietf").status == 400
    assert problems.invalid_key("ietf", KeyStatus.TOO_LONG).status == 400
    assert problems.request_too_large("ietf", 10).status == 413


def test_seed_is_a_deprecated_name_of_conflict409():
    with pytest.warns(DeprecationWarning, match="'seed' is now 'conflict409'.*0.7.0"):
        assert Config(profile="seed").profile == "conflict409"
    with pytest.warns(DeprecationWarning, match="seed"):
        assert problems.key_reused("seed").status == 409
    with pytest.warns(DeprecationWarning, match="pg_idem.SEED is now pg_idem.CONFLICT409"):
        assert pg_idem.SEED == pg_idem.CONFLICT409 == "conflict409"


def test_retry_after_rounds_up_to_whole_seconds():
    assert [retry_after_seconds(x) for x in (0, 0.001, 1.0, 1.001, 2.5)] == [1, 1, 1, 2, 3]


def test_config_defaults_are_the_cpp_clients():
    c = Config()
    assert (c.lease, c.renew_interval, c.follower_wait_budget, c.poll_min, c.poll_max, c.poll_jitter,
            c.retry_after, c.failure_cooldown, c.max_request_body_bytes, c.max_cacheable_response_bytes,
            c.max_iterations, c.transaction_attempts, c.profile) == \
        (30.0, 10.0, 5.0, 0.05, 1.0, 0.25, 1.0, 2.0, 1 << 20, 2 << 20, 100, 3, "ietf")
    assert Config(lease=9).renew_interval == 3


@pytest.mark.parametrize("kwargs,word", [
    ({"lease": 0}, "lease"), ({"lease": 0.005}, "at least 10 ms"), ({"lease": 90000}, "24 hours"),
    ({"lease": 1, "renew_interval": 1}, "shorter than lease"), ({"follower_wait_budget": -1}, "follower_wait_budget"),
    ({"poll_min": 2, "poll_max": 1}, "poll_min"), ({"poll_jitter": 1.0}, "poll_jitter"),
    ({"retry_after": 0}, "retry_after"), ({"failure_cooldown": 0}, "failure_cooldown"),
    ({"max_request_body_bytes": 0}, "max_request_body_bytes"), ({"max_iterations": 0}, "max_iterations"),
    ({"transaction_attempts": 0}, "transaction_attempts"), ({"profile": "x"}, "profile"),
    ({"replay_headers": ["Set-Cookie"]}, "never stored"), ({"replay_headers": ["Authorization"]}, "never stored"),
    ({"replay_headers": ["bad header"]}, "not a valid header name"), ({"schema": ""}, "schema"),
    ({"lease": "10"}, "lease"),
])
def test_config_refuses(kwargs, word):
    with pytest.raises(ConfigError) as e:
        Config(**kwargs)
    assert word in str(e.value)


def test_size_setting():
    assert parse_size_setting("2MB") == 2 << 20
    assert parse_size_setting("1024") == 1024
    assert parse_size_setting("8kB") == 8192
    assert parse_size_setting("-1") is None
    assert parse_size_setting(None) is None


def test_early_answers_need_no_database():
    e = Engine(Config(max_request_body_bytes=4))
    for keys, status in (([""], 400), (["a", "b"], 400), (["x" * 256], 400), ([b"\xff"], 400)):
        early, call = e.prepare(Request("p", "POST", "/", keys, b""))
        assert early.response.status == status and early.outcome == "rejected"
    early, _ = e.prepare(Request("p", "POST", "/", [], b"", key_required=True))
    assert early.response.status == 400
    early, _ = e.prepare(Request("p", "POST", "/", ["k"], b"12345"))
    assert early.response.status == 413
    early, call = e.prepare(Request("p", "POST", "/", [], b""))
    assert early is None and call is None  # unguarded


def test_response_coerces():
    r = Response(201, {"A": "b"}, "é")
    assert r.headers == [("A", "b")] and r.body == "é".encode()


def _check_row(version="0.6.0", has_edition=True, lock_wait=True):
    """A first-use check's row (_checks.preflight_sql's columns)."""
    return (version, "idem", True, True, None, True, True, lock_wait, 86400.0, "app", has_edition)


def test_first_use_check_names_the_edition_schema():
    from pg_idem._checks import edition_sql, verify
    cfg = Config()
    # the C edition or pg_tle's SQL edition (an extension row), 0.6.0
    assert verify(_check_row(), cfg, "db") == (True, True, True, False, "idem")
    # the SQL edition's plain script: no extension version, yet no router
    assert verify(_check_row(version=None), cfg, "db") == (True, True, True, False, "idem")
    # a PL/Proxy router: no version, no idem_edition
    assert verify(_check_row(version=None, has_edition=False, lock_wait=False), cfg, "db") == (
        True, True, False, True, None)
    # before 0.6.0 there is no idem_edition to ask, nor lock_wait
    assert verify(_check_row(version="0.5.0", has_edition=False, lock_wait=False), cfg, "db")[2:] == (
        False, False, None)
    assert edition_sql('my"schema') == 'SELECT "my""schema".idem_edition()'


def test_first_use_check_says_which_edition():
    from pg_idem._checks import describe_edition
    assert describe_edition("c", "0.6.0", "idem") == "pg_idem: the C edition 0.6.0 in schema idem"
    assert describe_edition("sql", "0.6.0", "idem") == "pg_idem: the SQL edition 0.6.0 in schema idem"
    assert describe_edition("sql", None, "public") == "pg_idem: the SQL edition (plain script) in schema public"
    assert describe_edition("x", "0.9.0", "idem") == "pg_idem: pg_idem (edition x) 0.9.0 in schema idem"
