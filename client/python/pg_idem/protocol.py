"""pg_idem's protocol: outcomes, problems, status classes and key statuses.

Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
"""

import collections
import enum

KEY_DOMAIN = "pg_idem key v1"
MAX_KEY_BYTES = 255
PROBLEM_BASE = "urn:pg-idem:problem:"
PROFILES = ('ietf', 'conflict409')
# Old names of a profile, accepted with a warning: {old: (profile, the release that drops it)}.
DEPRECATED_PROFILES = {'seed': ('conflict409', '0.7.0')}

# The oldest extension the runner works with (its first-use check refuses older).
OLDEST_EXTENSION = "0.3.0"
# A handler's validation failures: released, not stored, unless Config.client_errors = "store".
VALIDATION_STATUSES = (400, 422)

# A guarded request without a principal: refused ([client.missing_principal]).
MISSING_PRINCIPAL = "principal_missing"
MISSING_PRINCIPAL_RESULT = "rejected"
# An exhausted connection pool ([client.pool]): the answer's problem, its
# run result and metrics event, the wait of a pool the client bounds
# (seconds), the waiting duplicates' share of a pool, the fix every log line names.
POOL_EXHAUSTED = "pool_exhausted"
POOL_EXHAUSTED_RESULT = "failed"
POOL_EXHAUSTED_EVENT = "pool_exhausted"
POOL_WAIT = 5.0
POOL_DUPLICATES_SHARE = 0.5
POOL_EXHAUSTED_FIX = "give the pool more connections than the requests in flight at once (running handlers plus duplicates waiting for them), or lower the follower wait budget so that duplicates give up sooner"
# How long Runner.check() waits for a server that does not answer yet
# (seconds), and the SQLSTATEs it waits through ([client.startup]).
STARTUP_WAIT = 10.0
STARTUP_RETRY_SQLSTATES = ('57P03', '53300')
# (SQLSTATE, the server's words) of a refused connection, which libpq gives without its code.
CONNECT_MESSAGES = (
    ("28000", "role \".*\" does not exist|no pg_hba\\.conf entry|is not permitted to log in"),
    ("28P01", "password authentication failed|no password supplied"),
    ("3D000", "database \".*\" does not exist"),
    ("57P03", "the database system is (starting up|shutting down|in recovery mode|not yet accepting connections|not accepting connections)"),
    ("53300", "too many clients already|remaining connection slots are reserved"),
)

FINALIZE = "finalize"
RELEASE = "release"
FAIL = "fail"


class KeyStatus(enum.Enum):
    """What is wrong with a request's Idempotency-Key header(s), if anything."""

    OK = "ok"
    ABSENT = "absent"
    EMPTY = "empty"
    DUPLICATED = "duplicated"
    TOO_LONG = "too_long"
    CONTAINS_NUL = "contains_nul"
    INVALID_UTF8 = "invalid_utf8"


KEY_STATUS_DESCRIPTIONS = {
    KeyStatus.OK: "The Idempotency-Key is valid.",
    KeyStatus.ABSENT: "This operation requires an Idempotency-Key header.",
    KeyStatus.EMPTY: "The Idempotency-Key header is empty.",
    KeyStatus.DUPLICATED: "The request has more than one Idempotency-Key header.",
    KeyStatus.TOO_LONG: "The Idempotency-Key is longer than 255 bytes.",
    KeyStatus.CONTAINS_NUL: "The Idempotency-Key contains a NUL byte.",
    KeyStatus.INVALID_UTF8: "The Idempotency-Key is not valid UTF-8.",
}

# The client outcomes of a run (RunResult.outcome), also the metrics label.
CLIENT_OUTCOMES = ('won_completed', 'replay', 'conflict', 'timeout', 'failed', 'completed_uncacheable', 'unguarded', 'rejected', 'expired')

Problem = collections.namedtuple("Problem", "name slug title detail status retry_after")

# status: per profile.  detail: {key_status} and {limit} are filled in by the caller.
PROBLEMS = {
    "missing_key": Problem("missing_key", "idempotency-key-missing", "Idempotency-Key header is missing", "{key_status}",
                   {"ietf": 400, "conflict409": 400}, False),
    "invalid_key": Problem("invalid_key", "idempotency-key-invalid", "Idempotency-Key header is invalid", "{key_status}",
                   {"ietf": 400, "conflict409": 400}, False),
    "key_reused": Problem("key_reused", "idempotency-key-reused", "Idempotency-Key is already used for a different request", "This key was used with another request body. Use a new key for a new request.",
                   {"ietf": 422, "conflict409": 409}, False),
    "in_progress": Problem("in_progress", "request-in-progress", "A request with this Idempotency-Key is being processed", "Retry after the delay in Retry-After to get its response.",
                   {"ietf": 409, "conflict409": 503}, True),
    "cooldown": Problem("cooldown", "request-failed-recently", "The last attempt with this Idempotency-Key failed", "Retry after the delay in Retry-After.",
                   {"ietf": 503, "conflict409": 503}, True),
    "not_replayable": Problem("not_replayable", "response-not-replayable", "The request was completed but its response cannot be replayed", "The response was too large to store. Use a new key to repeat the request.",
                   {"ietf": 409, "conflict409": 409}, False),
    "expired": Problem("expired", "idempotency-key-expired", "This Idempotency-Key has expired", "The request with this key finished too long ago for its response to be kept. Use a new key to repeat the request.",
                   {"ietf": 410, "conflict409": 409}, False),
    "request_too_large": Problem("request_too_large", "request-too-large", "Request body too large", "The request body is over {limit} bytes.",
                   {"ietf": 413, "conflict409": 413}, False),
    "store_unavailable": Problem("store_unavailable", "idempotency-store-unavailable", "Idempotency store unavailable", "The request was not run. Retry after the delay in Retry-After.",
                   {"ietf": 503, "conflict409": 503}, True),
    "pool_exhausted": Problem("pool_exhausted", "connection-pool-exhausted", "The service's connection pool is exhausted", "The request was not run: no connection of this service's pool to the idempotency store came free in time. Retry after the delay in Retry-After.",
                   {"ietf": 503, "conflict409": 503}, True),
    "principal_missing": Problem("principal_missing", "principal-missing", "The request has no authenticated principal", "A request with an Idempotency-Key needs an authenticated principal, which is part of the key. Authenticate the request and retry.",
                   {"ietf": 401, "conflict409": 401}, False),
    "outcome_unknown": Problem("outcome_unknown", "outcome-unknown", "The outcome of this request is not known yet", "The request may have run, but its result is not recorded yet. Retry after the delay in Retry-After with the same Idempotency-Key.",
                   {"ietf": 503, "conflict409": 503}, True),
}

Outcome = collections.namedtuple("Outcome", "name role action problem result counted response")

# The server's claim outcomes and what a client does with each: run, replay,
# answer (the problem), wait (then the problem), claim.
OUTCOMES = {
    "claimed": Outcome("claimed", "win", "run", None, "won_completed", True, False),
    "recovered_ttl": Outcome("recovered_ttl", "win", "run", None, "won_completed", True, False),
    "recovered_abandoned": Outcome("recovered_abandoned", "win", "run", None, "won_completed", True, False),
    "replay": Outcome("replay", "follow", "replay", None, "replay", True, True),
    "mismatch": Outcome("mismatch", "follow", "answer", "key_reused", "conflict", True, False),
    "in_progress": Outcome("in_progress", "follow", "wait", "in_progress", "timeout", True, False),
    "cooldown": Outcome("cooldown", "follow", "answer", "cooldown", "failed", True, False),
    "not_replayable": Outcome("not_replayable", "follow", "answer", "not_replayable", "conflict", True, True),
    "expired": Outcome("expired", "follow", "answer", "expired", "expired", True, True),
    "absent": Outcome("absent", "lookup", "claim", None, None, False, False),
    "claimable": Outcome("claimable", "lookup", "claim", None, None, False, False),
}

# (lowest status, highest status, action): the first that matches decides.
STORAGE_RULES = (
    (200, 299, FINALIZE),
    (400, 400, FINALIZE),
    (404, 404, FINALIZE),
    (409, 409, FINALIZE),
    (422, 422, FINALIZE),
    (408, 408, FAIL),
    (429, 429, FAIL),
    (500, 599, FAIL),
    (100, 499, RELEASE),
)
STORAGE_DEFAULT = FAIL

SQLSTATES = {
    "IL001": "lease_lost",
    "IL002": "claim_unfinished",
    "IL003": "message_unfinished",
    "IL004": "stale_version",
    "IL005": "illegal_transition",
    "IL006": "promotion_unpublished",
}


def classify(status):
    """What the winner does with its handler's response: FINALIZE, RELEASE or FAIL."""
    for lo, hi, action in STORAGE_RULES:
        if lo <= status <= hi:
            return action
    return STORAGE_DEFAULT



class ServerOutcome:
    """The server's claim outcomes (the outcome column of idem_claim), by name."""

    CLAIMED = "claimed"
    RECOVERED_TTL = "recovered_ttl"
    RECOVERED_ABANDONED = "recovered_abandoned"
    REPLAY = "replay"
    MISMATCH = "mismatch"
    IN_PROGRESS = "in_progress"
    COOLDOWN = "cooldown"
    NOT_REPLAYABLE = "not_replayable"
    EXPIRED = "expired"
    ABSENT = "absent"
    CLAIMABLE = "claimable"


class ClientOutcome:
    """What a run reports (RunResult.outcome), by name."""

    WON_COMPLETED = "won_completed"
    REPLAY = "replay"
    CONFLICT = "conflict"
    TIMEOUT = "timeout"
    FAILED = "failed"
    COMPLETED_UNCACHEABLE = "completed_uncacheable"
    UNGUARDED = "unguarded"
    REJECTED = "rejected"
    EXPIRED = "expired"


class Action:
    """What a client does with a server outcome (Outcome.action)."""

    RUN = "run"
    REPLAY = "replay"
    ANSWER = "answer"
    WAIT = "wait"
    CLAIM = "claim"


class ProblemName:
    """The problems a client answers with (PROBLEMS' keys)."""

    MISSING_KEY = "missing_key"
    INVALID_KEY = "invalid_key"
    KEY_REUSED = "key_reused"
    IN_PROGRESS = "in_progress"
    COOLDOWN = "cooldown"
    NOT_REPLAYABLE = "not_replayable"
    EXPIRED = "expired"
    REQUEST_TOO_LARGE = "request_too_large"
    STORE_UNAVAILABLE = "store_unavailable"
    POOL_EXHAUSTED = "pool_exhausted"
    PRINCIPAL_MISSING = "principal_missing"
    OUTCOME_UNKNOWN = "outcome_unknown"


class Event:
    """The claim's lifecycle events (RunResult.events, metrics' on_event)."""

    CLAIMED = "claimed"
    RECOVERED_TTL = "recovered_ttl"
    RECOVERED_ABANDONED = "recovered_abandoned"
    PENDING_WAIT = "pending_wait"
    RETRYABLE_COOLDOWN = "retryable_cooldown"
    LEASE_STOLEN = "lease_stolen"
    FINALIZE_ERROR = "finalize_error"
    RELEASE_ERROR = "release_error"
    UNKNOWN_OUTCOME = "unknown_outcome"
    FINALIZED = "finalized"
    POOL_EXHAUSTED = "pool_exhausted"


class Profile:
    """The HTTP status profiles (Config.profile)."""

    IETF = "ietf"
    CONFLICT409 = "conflict409"


class ClientErrors:
    """What a runner does with a handler's validation failure (Config.client_errors)."""

    RELEASE = "release"
    STORE = "store"


EVENTS = (
    "claimed",
    "recovered_ttl",
    "recovered_abandoned",
    "pending_wait",
    "retryable_cooldown",
    "lease_stolen",
    "finalize_error",
    "release_error",
    "unknown_outcome",
    "finalized",
    "pool_exhausted",
)

# What a Config is when it is told nothing (durations in milliseconds).
DEFAULTS = {
    "lease_ms": 30000,
    "renew_divisor": 3,
    "follower_wait_budget_ms": 5000,
    "poll_min_ms": 50,
    "poll_max_ms": 1000,
    "poll_jitter": 0.25,
    "retry_after_ms": 1000,
    "failure_cooldown_ms": 2000,
    "max_request_body_bytes": 1048576,
    "max_cacheable_response_bytes": 2097152,
    "max_iterations": 100,
    "transaction_attempts": 3,
    "profile": "ietf",
    "client_errors": "release",
    "wait_slice_ms": 100,
    "pooled_wait_slice_ms": 200,
}
# What a Config may not be.
LIMITS = {
    "min_lease_ms": 10,
    "max_lease_ms": 86400000,
    "client_errors": ("release", "store"),
}

# The header a replayed answer carries (value "true").
REPLAYED_HEADER = "Idempotent-Replayed"
# Response headers kept for replay unless configured otherwise.
DEFAULT_REPLAY_HEADERS = ("content-type", "content-disposition", "content-language", "cache-control", "etag", "location")
# Never stored, whatever the configuration says; nor a header whose
# lower-case name contains one of the parts.
NEVER_STORED_HEADERS = frozenset((
    "set-cookie", "set-cookie2", "cookie", "authorization", "proxy-authorization",
    "www-authenticate", "proxy-authenticate", "x-api-key", "x-csrf-token", "x-xsrf-token",
))
NEVER_STORED_HEADER_PARTS = ('cookie', 'session', 'token', 'authoriz', 'authenticat')

Series = collections.namedtuple("Series", "name help label")
# The metrics' series (prometheus_client adds _total to a counter's name).
METRICS = {
    "requests": Series("idem_client_requests", "Requests through the pg_idem runner, by outcome.", "outcome"),
    "events": Series("idem_client_events", "Claim lifecycle events seen by the pg_idem runner.", "event"),
}


def namespaced_target(namespace, target):
    """The target a namespace makes: the namespace, " ", the target (None: no namespace)."""
    return target if namespace is None else namespace + " " + target


# ---- messaging: the inbox's answers, a consumer's results, the relay ----

class InboxAnswer(str, enum.Enum):
    """What idem_inbox_begin and idem_inbox_fail answer."""

    PROCESS = "process"  # from begin
    DUPLICATE = "duplicate"  # from begin, fail
    DEAD = "dead"  # from begin, fail
    MISMATCH = "mismatch"  # from begin
    RETRY = "retry"  # from fail


class InboxOutcome(str, enum.Enum):
    """What a consumer reports for a delivery (InboxResult.outcome), also its metrics label."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    DEAD = "dead"
    MISMATCH = "mismatch"
    RETRY = "retry"
    UNKNOWN = "unknown"


class BrokerAction(str, enum.Enum):
    """What a consumer does with a delivery at its broker."""

    ACK = "ack"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeue_after"


# The consumer's result for each server answer (process: once done commits).
INBOX_RESULT_OF = {
    InboxAnswer.PROCESS: InboxOutcome.PROCESSED,
    InboxAnswer.DUPLICATE: InboxOutcome.DUPLICATE,
    InboxAnswer.DEAD: InboxOutcome.DEAD,
    InboxAnswer.MISMATCH: InboxOutcome.MISMATCH,
    InboxAnswer.RETRY: InboxOutcome.RETRY,
}
BROKER_ACTION_OF = {
    InboxOutcome.PROCESSED: BrokerAction.ACK,
    InboxOutcome.DUPLICATE: BrokerAction.ACK,
    InboxOutcome.DEAD: BrokerAction.ACK,
    InboxOutcome.MISMATCH: BrokerAction.ACK,
    InboxOutcome.RETRY: BrokerAction.REQUEUE_AFTER,
    InboxOutcome.UNKNOWN: BrokerAction.REQUEUE,
}
INBOX_DEFAULT_MAX_ATTEMPTS = 5
INBOX_MAX_ATTEMPTS = 1000


class NackOutcome(str, enum.Enum):
    """What idem_outbox_nack answers."""

    RETRY = "retry"
    DEAD = "dead"
    STALE = "stale"


# The count of a relay's batch report that each nack outcome adds to.
NACK_COUNT = {
    NackOutcome.RETRY: "retried",
    NackOutcome.DEAD: "dead",
    NackOutcome.STALE: "stale",
}
# What a relay's batch report counts (BatchReport's fields), also its metrics label.
RELAY_COUNTS = ('claimed', 'published', 'acked', 'lease_lost', 'retried', 'dead', 'stale', 'held_back', 'expired', 'abandoned')
INBOX_METRIC = "idem_client_inbox_messages_total"
INBOX_METRIC_LABEL = "outcome"
INBOX_METRIC_HELP = "Deliveries handled by the pg_idem inbox consumer, by outcome."
RELAY_METRIC = "idem_client_outbox_events_total"
RELAY_METRIC_LABEL = "result"
RELAY_METRIC_HELP = "Outbox events seen by the pg_idem relay, by what became of them."
