"""The HTTP side: response, replay header allowlist and RFC 9457 problem
details. The statuses, problems and storage rules are the protocol's
(pg_idem.protocol, generated from extension/protocol/protocol.toml)."""

import dataclasses
import json
import math
import warnings

from . import protocol
from .key import KeyStatus, describe
from .protocol import ProblemName

REPLAY_HEADER = protocol.REPLAYED_HEADER
PROBLEM_BASE = protocol.PROBLEM_BASE

# What the winner does with its handler's response: stored and replayed,
# not stored with the key free at once, not stored with a cooldown.
FINALIZE, RELEASE, FAIL = protocol.FINALIZE, protocol.RELEASE, protocol.FAIL

# The replay headers are the protocol's (protocol.toml's [replay_headers]).
DEFAULT_REPLAY_HEADERS = protocol.DEFAULT_REPLAY_HEADERS


@dataclasses.dataclass
class Response:
    """What a handler answers: status, headers as (name, value) pairs, body bytes."""

    status: int = 200
    headers: list = dataclasses.field(default_factory=list)
    body: bytes = b""

    def __post_init__(self):
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")
        if isinstance(self.headers, dict):
            self.headers = list(self.headers.items())
        self.headers = [(str(n), str(v)) for n, v in self.headers]

    def header(self, name):
        """First value of a header (names compare case-insensitively), or None."""
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None


def classify(status):
    """What the winner does with its handler's response (the protocol's storage rules)."""
    return protocol.classify(status)


def is_never_stored(name):
    """Headers never stored whatever the configuration (cookies, auth, session tokens)."""
    low = name.lower()
    return low in protocol.NEVER_STORED_HEADERS or any(p in low for p in protocol.NEVER_STORED_HEADER_PARTS)


class HeaderAllowlist:
    """The response headers kept for replay: the defaults plus the configured ones."""

    def __init__(self, extra=()):
        self.names = list(DEFAULT_REPLAY_HEADERS)
        for n in extra:
            n = n.lower()
            if not is_never_stored(n) and n not in self.names:
                self.names.append(n)

    def allows(self, name):
        return not is_never_stored(name) and name.lower() in self.names

    def to_json(self, headers):
        """The allowed headers as a JSON object text with lower-case names; repeats joined with ", "."""
        out = {}
        for n, v in headers:
            if not self.allows(n) or "\x00" in v:
                continue
            n = n.lower()
            out[n] = out[n] + ", " + v if n in out else v
        return json.dumps(out, ensure_ascii=False)


def headers_from_json(text):
    """What to_json stored (any JSON object) back to header pairs."""
    try:
        obj = json.loads(text) if text else {}
    except ValueError:
        return []
    if not isinstance(obj, dict):
        return []
    return [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in obj.items() if v is not None]


def retry_after_seconds(seconds):
    """Retry-After in whole seconds, rounded up, at least 1."""
    return max(1, int(math.ceil(round(seconds, 6))))


def problem(status, title, detail=None, type_=None, retry_after=None):
    """An RFC 9457 problem details response (application/problem+json)."""
    body = {"type": type_ or "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    headers = [("Content-Type", "application/problem+json")]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after_seconds(retry_after))))
    return Response(status, headers, json.dumps(body, ensure_ascii=False))


def profile_of(profile):
    """A profile's name, the deprecated ones (protocol.DEPRECATED_PROFILES) with a warning."""
    if profile in protocol.DEPRECATED_PROFILES:
        new, until = protocol.DEPRECATED_PROFILES[profile]
        warnings.warn("pg_idem: profile %r is now %r; the old name goes in %s" % (profile, new, until),
                      DeprecationWarning, stacklevel=3)
        return new
    return profile


def _make(name, profile, retry_after=None, **fill):
    """The protocol's problem `name` in `profile`; {key_status} and {limit} filled in."""
    p = protocol.PROBLEMS[name]
    profile = profile_of(profile)
    return problem(p.status[profile], p.title, p.detail.format(**fill), protocol.PROBLEM_BASE + p.slug,
                   retry_after if p.retry_after else None)


class problems:
    """The answers the runner gives instead of running the handler, per profile
    (extension/protocol/protocol.toml, through the generated pg_idem.protocol)."""

    @staticmethod
    def missing_key(profile):
        return _make(ProblemName.MISSING_KEY, profile, key_status=describe(KeyStatus.ABSENT))

    @staticmethod
    def invalid_key(profile, why):
        return _make(ProblemName.INVALID_KEY, profile, key_status=describe(why))

    @staticmethod
    def key_reused(profile):
        return _make(ProblemName.KEY_REUSED, profile)

    @staticmethod
    def in_progress(profile, retry_after):
        return _make(ProblemName.IN_PROGRESS, profile, retry_after)

    @staticmethod
    def cooldown(profile, retry_after):
        return _make(ProblemName.COOLDOWN, profile, retry_after)

    @staticmethod
    def not_replayable(profile):
        return _make(ProblemName.NOT_REPLAYABLE, profile)

    @staticmethod
    def expired(profile):
        return _make(ProblemName.EXPIRED, profile)

    @staticmethod
    def request_too_large(profile, limit):
        return _make(ProblemName.REQUEST_TOO_LARGE, profile, limit=limit)

    @staticmethod
    def store_unavailable(profile, retry_after):
        return _make(ProblemName.STORE_UNAVAILABLE, profile, retry_after)

    @staticmethod
    def outcome_unknown(profile, retry_after):
        return _make(ProblemName.OUTCOME_UNKNOWN, profile, retry_after)

    @staticmethod
    def by_name(name, profile, retry_after=None):
        """The problem the protocol names for an outcome (OUTCOMES[...].problem)."""
        return _make(name, profile, retry_after)
