'use strict';
// pg_idem's protocol: outcomes, problems, status classes and key statuses.
// Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.

const KEY_DOMAIN = "pg_idem key v1";
const MAX_KEY_BYTES = 255;
const PROBLEM_BASE = "urn:pg-idem:problem:";
const PROFILES = Object.freeze(["ietf", "conflict409"]);
// Old names of a profile, accepted with a warning: {old: {profile, until}}.
const DEPRECATED_PROFILES = Object.freeze({"seed": {"profile": "conflict409", "until": "0.7.0"}});

// The oldest extension the runner works with (its first-use check refuses older).
const OLDEST_EXTENSION = "0.3.0";
// A handler's validation failures: released, not stored, unless storeClientErrors.
const VALIDATION_STATUSES = Object.freeze([400, 422]);

// A guarded request without a principal: refused ([client.missing_principal]).
const MISSING_PRINCIPAL = Object.freeze({"problem": "principal_missing", "result": "rejected"});
// An exhausted connection pool ([client.pool]): the answer's problem, its run
// result and metrics event, how long a request waits for a connection (ms),
// the waiting duplicates' share of a pool, the fix every log line names.
const POOL = Object.freeze({"problem": "pool_exhausted", "result": "failed", "event": "pool_exhausted", "waitMs": 5000, "duplicatesShare": 0.5, "fix": "give the pool more connections than the requests in flight at once (running handlers plus duplicates waiting for them), or lower the follower wait budget so that duplicates give up sooner"});
// How long ready() waits for a server that does not answer yet (ms), and
// the SQLSTATEs it waits through ([client.startup]).
const STARTUP = Object.freeze({"waitMs": 10000, "retrySqlstates": ["57P03", "53300"]});

const FINALIZE = 'finalize';
const RELEASE = 'release';
const FAIL = 'fail';

// What is wrong with a request's Idempotency-Key header(s), if anything.
const KeyStatus = Object.freeze({
  OK: "ok",
  ABSENT: "absent",
  EMPTY: "empty",
  DUPLICATED: "duplicated",
  TOO_LONG: "too_long",
  CONTAINS_NUL: "contains_nul",
  INVALID_UTF8: "invalid_utf8",
});

const KEY_STATUS_DESCRIPTIONS = Object.freeze({
  ok: "The Idempotency-Key is valid.",
  absent: "This operation requires an Idempotency-Key header.",
  empty: "The Idempotency-Key header is empty.",
  duplicated: "The request has more than one Idempotency-Key header.",
  too_long: "The Idempotency-Key is longer than 255 bytes.",
  contains_nul: "The Idempotency-Key contains a NUL byte.",
  invalid_utf8: "The Idempotency-Key is not valid UTF-8.",
});

// The client outcomes of a run (result.outcome), also the metrics label.
const CLIENT_OUTCOMES = Object.freeze(["won_completed", "replay", "conflict", "timeout", "failed", "completed_uncacheable", "unguarded", "rejected", "expired"]);

// status: per profile.  detail: {key_status} and {limit} are filled in by the caller.
const PROBLEMS = Object.freeze({
  missing_key: Object.freeze({ name: "missing_key", slug: "idempotency-key-missing", title: "Idempotency-Key header is missing", detail: "{key_status}", status: Object.freeze({"ietf": 400, "conflict409": 400}), retryAfter: false }),
  invalid_key: Object.freeze({ name: "invalid_key", slug: "idempotency-key-invalid", title: "Idempotency-Key header is invalid", detail: "{key_status}", status: Object.freeze({"ietf": 400, "conflict409": 400}), retryAfter: false }),
  key_reused: Object.freeze({ name: "key_reused", slug: "idempotency-key-reused", title: "Idempotency-Key is already used for a different request", detail: "This key was used with another request body. Use a new key for a new request.", status: Object.freeze({"ietf": 422, "conflict409": 409}), retryAfter: false }),
  in_progress: Object.freeze({ name: "in_progress", slug: "request-in-progress", title: "A request with this Idempotency-Key is being processed", detail: "Retry after the delay in Retry-After to get its response.", status: Object.freeze({"ietf": 409, "conflict409": 503}), retryAfter: true }),
  cooldown: Object.freeze({ name: "cooldown", slug: "request-failed-recently", title: "The last attempt with this Idempotency-Key failed", detail: "Retry after the delay in Retry-After.", status: Object.freeze({"ietf": 503, "conflict409": 503}), retryAfter: true }),
  not_replayable: Object.freeze({ name: "not_replayable", slug: "response-not-replayable", title: "The request was completed but its response cannot be replayed", detail: "The response was too large to store. Use a new key to repeat the request.", status: Object.freeze({"ietf": 409, "conflict409": 409}), retryAfter: false }),
  expired: Object.freeze({ name: "expired", slug: "idempotency-key-expired", title: "This Idempotency-Key has expired", detail: "The request with this key finished too long ago for its response to be kept. Use a new key to repeat the request.", status: Object.freeze({"ietf": 410, "conflict409": 409}), retryAfter: false }),
  request_too_large: Object.freeze({ name: "request_too_large", slug: "request-too-large", title: "Request body too large", detail: "The request body is over {limit} bytes.", status: Object.freeze({"ietf": 413, "conflict409": 413}), retryAfter: false }),
  store_unavailable: Object.freeze({ name: "store_unavailable", slug: "idempotency-store-unavailable", title: "Idempotency store unavailable", detail: "The request was not run. Retry after the delay in Retry-After.", status: Object.freeze({"ietf": 503, "conflict409": 503}), retryAfter: true }),
  pool_exhausted: Object.freeze({ name: "pool_exhausted", slug: "connection-pool-exhausted", title: "The service's connection pool is exhausted", detail: "The request was not run: no connection of this service's pool to the idempotency store came free in time. Retry after the delay in Retry-After.", status: Object.freeze({"ietf": 503, "conflict409": 503}), retryAfter: true }),
  principal_missing: Object.freeze({ name: "principal_missing", slug: "principal-missing", title: "The request has no authenticated principal", detail: "A request with an Idempotency-Key needs an authenticated principal, which is part of the key. Authenticate the request and retry.", status: Object.freeze({"ietf": 401, "conflict409": 401}), retryAfter: false }),
  outcome_unknown: Object.freeze({ name: "outcome_unknown", slug: "outcome-unknown", title: "The outcome of this request is not known yet", detail: "The request may have run, but its result is not recorded yet. Retry after the delay in Retry-After with the same Idempotency-Key.", status: Object.freeze({"ietf": 503, "conflict409": 503}), retryAfter: true }),
});

// The server's claim outcomes and what a client does with each: run, replay,
// answer (the problem), wait (then the problem), claim.
const OUTCOMES = Object.freeze({
  claimed: Object.freeze({ name: "claimed", role: "win", action: "run", problem: null, result: "won_completed", counted: true, response: false }),
  recovered_ttl: Object.freeze({ name: "recovered_ttl", role: "win", action: "run", problem: null, result: "won_completed", counted: true, response: false }),
  recovered_abandoned: Object.freeze({ name: "recovered_abandoned", role: "win", action: "run", problem: null, result: "won_completed", counted: true, response: false }),
  replay: Object.freeze({ name: "replay", role: "follow", action: "replay", problem: null, result: "replay", counted: true, response: true }),
  mismatch: Object.freeze({ name: "mismatch", role: "follow", action: "answer", problem: "key_reused", result: "conflict", counted: true, response: false }),
  in_progress: Object.freeze({ name: "in_progress", role: "follow", action: "wait", problem: "in_progress", result: "timeout", counted: true, response: false }),
  cooldown: Object.freeze({ name: "cooldown", role: "follow", action: "answer", problem: "cooldown", result: "failed", counted: true, response: false }),
  not_replayable: Object.freeze({ name: "not_replayable", role: "follow", action: "answer", problem: "not_replayable", result: "conflict", counted: true, response: true }),
  expired: Object.freeze({ name: "expired", role: "follow", action: "answer", problem: "expired", result: "expired", counted: true, response: true }),
  absent: Object.freeze({ name: "absent", role: "lookup", action: "claim", problem: null, result: null, counted: false, response: false }),
  claimable: Object.freeze({ name: "claimable", role: "lookup", action: "claim", problem: null, result: null, counted: false, response: false }),
});

// [lowest status, highest status, action]: the first that matches decides.
const STORAGE_RULES = Object.freeze([
  [200, 299, FINALIZE],
  [400, 400, FINALIZE],
  [404, 404, FINALIZE],
  [409, 409, FINALIZE],
  [422, 422, FINALIZE],
  [408, 408, FAIL],
  [429, 429, FAIL],
  [500, 599, FAIL],
  [100, 499, RELEASE],
]);
const STORAGE_DEFAULT = FAIL;

const SQLSTATES = Object.freeze({
  IL001: "lease_lost",
  IL002: "claim_unfinished",
  IL003: "message_unfinished",
  IL004: "stale_version",
  IL005: "illegal_transition",
  IL006: "promotion_unpublished",
});

// What the winner does with its handler's response: FINALIZE, RELEASE or FAIL.
function classify(status) {
  for (const [lo, hi, action] of STORAGE_RULES) if (status >= lo && status <= hi) return action;
  return STORAGE_DEFAULT;
}

// The server's claim outcomes (the outcome column of idem_claim), by name.
const ServerOutcome = Object.freeze({
  CLAIMED: "claimed",
  RECOVERED_TTL: "recovered_ttl",
  RECOVERED_ABANDONED: "recovered_abandoned",
  REPLAY: "replay",
  MISMATCH: "mismatch",
  IN_PROGRESS: "in_progress",
  COOLDOWN: "cooldown",
  NOT_REPLAYABLE: "not_replayable",
  EXPIRED: "expired",
  ABSENT: "absent",
  CLAIMABLE: "claimable",
});

// What a run reports (result.outcome), by name.
const ClientOutcome = Object.freeze({
  WON_COMPLETED: "won_completed",
  REPLAY: "replay",
  CONFLICT: "conflict",
  TIMEOUT: "timeout",
  FAILED: "failed",
  COMPLETED_UNCACHEABLE: "completed_uncacheable",
  UNGUARDED: "unguarded",
  REJECTED: "rejected",
  EXPIRED: "expired",
});

// What a client does with a server outcome (OUTCOMES[...].action).
const Action = Object.freeze({
  RUN: "run",
  REPLAY: "replay",
  ANSWER: "answer",
  WAIT: "wait",
  CLAIM: "claim",
});

// The problems a client answers with (PROBLEMS' keys).
const ProblemName = Object.freeze({
  MISSING_KEY: "missing_key",
  INVALID_KEY: "invalid_key",
  KEY_REUSED: "key_reused",
  IN_PROGRESS: "in_progress",
  COOLDOWN: "cooldown",
  NOT_REPLAYABLE: "not_replayable",
  EXPIRED: "expired",
  REQUEST_TOO_LARGE: "request_too_large",
  STORE_UNAVAILABLE: "store_unavailable",
  POOL_EXHAUSTED: "pool_exhausted",
  PRINCIPAL_MISSING: "principal_missing",
  OUTCOME_UNKNOWN: "outcome_unknown",
});

// The claim's lifecycle events (metrics' onEvent).
const Event = Object.freeze({
  CLAIMED: "claimed",
  RECOVERED_TTL: "recovered_ttl",
  RECOVERED_ABANDONED: "recovered_abandoned",
  PENDING_WAIT: "pending_wait",
  RETRYABLE_COOLDOWN: "retryable_cooldown",
  LEASE_STOLEN: "lease_stolen",
  FINALIZE_ERROR: "finalize_error",
  RELEASE_ERROR: "release_error",
  UNKNOWN_OUTCOME: "unknown_outcome",
  FINALIZED: "finalized",
  POOL_EXHAUSTED: "pool_exhausted",
});

// The HTTP status profiles (config.profile).
const Profile = Object.freeze({
  IETF: "ietf",
  CONFLICT409: "conflict409",
});

const EVENTS = Object.freeze(Object.values(Event));

// What a Config is when it is told nothing (durations in milliseconds).
const DEFAULTS = Object.freeze({
  lease_ms: 30000,
  renew_divisor: 3,
  follower_wait_budget_ms: 5000,
  poll_min_ms: 50,
  poll_max_ms: 1000,
  poll_jitter: 0.25,
  retry_after_ms: 1000,
  failure_cooldown_ms: 2000,
  max_request_body_bytes: 1048576,
  max_cacheable_response_bytes: 2097152,
  max_iterations: 100,
  transaction_attempts: 3,
  profile: "ietf",
  client_errors: "release",
  wait_slice_ms: 100,
  pooled_wait_slice_ms: 200,
});
// What a Config may not be.
const LIMITS = Object.freeze({
  min_lease_ms: 10,
  max_lease_ms: 86400000,
  client_errors: ["release", "store"],
});

// The header a replayed answer carries (value 'true').
const REPLAYED_HEADER = "Idempotent-Replayed";
// Response headers kept for replay unless configured otherwise.
const DEFAULT_REPLAY_HEADERS = Object.freeze(["content-type", "content-disposition", "content-language", "cache-control", "etag", "location"]);
// Never stored, whatever the configuration says; nor a header whose
// lower-case name contains one of the parts.
const NEVER_STORED_HEADERS = Object.freeze(["set-cookie", "set-cookie2", "cookie", "authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate", "x-api-key", "x-csrf-token", "x-xsrf-token"]);
const NEVER_STORED_HEADER_PARTS = Object.freeze(["cookie", "session", "token", "authoriz", "authenticat"]);

// The metrics' series: prom-client takes the exported name, with _total.
const METRICS = Object.freeze({
  requests: Object.freeze({ name: "idem_client_requests_total", help: "Requests through the pg_idem runner, by outcome.", label: "outcome" }),
  events: Object.freeze({ name: "idem_client_events_total", help: "Claim lifecycle events seen by the pg_idem runner.", label: "event" }),
});

// The target a namespace makes: the namespace, " ", the target (undefined: no namespace).
function namespacedTarget(namespace, target) {
  return namespace === undefined || namespace === null ? target : `${namespace} ${target}`;
}

// ---- messaging: the inbox's answers, a consumer's results, the relay ----

// What idem_inbox_begin and idem_inbox_fail answer.
const InboxAnswer = Object.freeze({
  PROCESS: "process",
  DUPLICATE: "duplicate",
  DEAD: "dead",
  MISMATCH: "mismatch",
  RETRY: "retry",
});

// What a consumer reports for a delivery (result.outcome), also its metrics label.
const InboxOutcome = Object.freeze({
  PROCESSED: "processed",
  DUPLICATE: "duplicate",
  DEAD: "dead",
  MISMATCH: "mismatch",
  RETRY: "retry",
  UNKNOWN: "unknown",
});

// What a consumer does with a delivery at its broker.
const BrokerAction = Object.freeze({
  ACK: "ack",
  REQUEUE: "requeue",
  REQUEUE_AFTER: "requeue_after",
});

// The consumer's result for each server answer (process: once done commits).
const INBOX_RESULT_OF = Object.freeze({"process": "processed", "duplicate": "duplicate", "dead": "dead", "mismatch": "mismatch", "retry": "retry"});
const BROKER_ACTION_OF = Object.freeze({"processed": "ack", "duplicate": "ack", "dead": "ack", "mismatch": "ack", "retry": "requeue_after", "unknown": "requeue"});
const INBOX_DEFAULT_MAX_ATTEMPTS = 5;
const INBOX_MAX_ATTEMPTS = 1000;

// What idem_outbox_nack answers.
const NackOutcome = Object.freeze({
  RETRY: "retry",
  DEAD: "dead",
  STALE: "stale",
});

// The count of a relay's batch report that each nack outcome adds to.
const NACK_COUNT = Object.freeze({"retry": "retried", "dead": "dead", "stale": "stale"});
// What a relay's batch report counts, also its metrics label.
const RELAY_COUNTS = Object.freeze(["claimed", "published", "acked", "lease_lost", "retried", "dead", "stale", "held_back", "expired", "abandoned"]);
const MESSAGING_METRICS = Object.freeze({"inbox": "idem_client_inbox_messages_total", "inbox_label": "outcome", "inbox_help": "Deliveries handled by the pg_idem inbox consumer, by outcome.", "relay": "idem_client_outbox_events_total", "relay_label": "result", "relay_help": "Outbox events seen by the pg_idem relay, by what became of them."});

module.exports = {
  KEY_DOMAIN, MAX_KEY_BYTES, PROBLEM_BASE, PROFILES, DEPRECATED_PROFILES, OLDEST_EXTENSION,
  VALIDATION_STATUSES, FINALIZE, RELEASE, FAIL, KeyStatus,
  KEY_STATUS_DESCRIPTIONS, CLIENT_OUTCOMES, PROBLEMS, OUTCOMES, STORAGE_RULES, STORAGE_DEFAULT,
  SQLSTATES, classify,
  ServerOutcome, ClientOutcome, Action, ProblemName, Event, Profile, EVENTS, DEFAULTS, LIMITS,
  REPLAYED_HEADER, DEFAULT_REPLAY_HEADERS, NEVER_STORED_HEADERS, NEVER_STORED_HEADER_PARTS,
  METRICS, namespacedTarget,
  MISSING_PRINCIPAL, POOL, STARTUP,
  InboxAnswer, InboxOutcome, BrokerAction, INBOX_RESULT_OF, BROKER_ACTION_OF, INBOX_DEFAULT_MAX_ATTEMPTS, INBOX_MAX_ATTEMPTS, NackOutcome, NACK_COUNT, RELAY_COUNTS, MESSAGING_METRICS,
};
