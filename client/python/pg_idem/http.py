"""The HTTP side: response, status matrix, replay header allowlist and
RFC 9457 problem details (the same as the C++ client's idem/http.hpp)."""

import dataclasses
import json
import math

from .key import KeyStatus, describe

REPLAY_HEADER = "Idempotent-Replayed"
PROBLEM_BASE = "urn:pg-idem:problem:"

FINALIZE = "finalize"   # 2xx, 400, 404, 409, 422: stored and replayed
RELEASE = "release"     # 1xx, 3xx, 401, 403, other 4xx: not stored, key free at once
FAIL = "fail"           # 5xx, 408, 429: not stored, key in cooldown

DEFAULT_REPLAY_HEADERS = ("content-type", "content-disposition", "content-language",
                          "cache-control", "etag", "location")
_NEVER_STORED = frozenset(("set-cookie", "set-cookie2", "cookie", "authorization",
                           "proxy-authorization", "www-authenticate", "proxy-authenticate",
                           "x-api-key", "x-csrf-token", "x-xsrf-token"))
_NEVER_STORED_PARTS = ("cookie", "session", "token", "authoriz", "authenticat")


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
    """What the winner does with its handler's response."""
    if 200 <= status <= 299 or status in (400, 404, 409, 422):
        return FINALIZE
    if status in (408, 429) or 500 <= status <= 599:
        return FAIL
    if 100 <= status <= 499:
        return RELEASE
    return FAIL  # not an HTTP status: treat as a server error


def is_never_stored(name):
    """Headers never stored whatever the configuration (cookies, auth, session tokens)."""
    low = name.lower()
    return low in _NEVER_STORED or any(p in low for p in _NEVER_STORED_PARTS)


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


def _make(status, slug, title, detail, retry=None):
    return problem(status, title, detail, PROBLEM_BASE + slug, retry)


class problems:
    """The answers the runner gives instead of running the handler, per profile."""

    @staticmethod
    def missing_key(profile):
        return _make(400, "idempotency-key-missing", "Idempotency-Key header is missing",
                     describe(KeyStatus.ABSENT))

    @staticmethod
    def invalid_key(profile, why):
        return _make(400, "idempotency-key-invalid", "Idempotency-Key header is invalid", describe(why))

    @staticmethod
    def key_reused(profile):
        return _make(422 if profile == "ietf" else 409, "idempotency-key-reused",
                     "Idempotency-Key is already used for a different request",
                     "This key was used with another request body. Use a new key for a new request.")

    @staticmethod
    def in_progress(profile, retry_after):
        return _make(409 if profile == "ietf" else 503, "request-in-progress",
                     "A request with this Idempotency-Key is being processed",
                     "Retry after the delay in Retry-After to get its response.", retry_after)

    @staticmethod
    def cooldown(profile, retry_after):
        return _make(503, "request-failed-recently", "The last attempt with this Idempotency-Key failed",
                     "Retry after the delay in Retry-After.", retry_after)

    @staticmethod
    def not_replayable(profile):
        return _make(409, "response-not-replayable",
                     "The request was completed but its response cannot be replayed",
                     "The response was too large to store. Use a new key to repeat the request.")

    @staticmethod
    def expired(profile):
        return _make(410, "idempotency-key-expired", "This Idempotency-Key has expired",
                     "The request was completed too long ago for its response to be kept. "
                     "Use a new key to repeat the request.")

    @staticmethod
    def request_too_large(profile, limit):
        return _make(413, "request-too-large", "Request body too large",
                     "The request body is over %d bytes." % limit)

    @staticmethod
    def store_unavailable(profile, retry_after):
        return _make(503, "idempotency-store-unavailable", "Idempotency store unavailable",
                     "The request was not run. Retry after the delay in Retry-After.", retry_after)

    @staticmethod
    def outcome_unknown(profile, retry_after):
        return _make(503, "outcome-unknown", "The outcome of this request is not known yet",
                     "Retry with the same Idempotency-Key: the request will not be run twice.", retry_after)
