// pg_idem C++ client: the protocol, generated.
// Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace idem {

// What a run reports (run_result::outcome), also its metrics label.
enum class outcome
{
    won_completed,  // this request ran the handler and its result is recorded
    replay,  // a stored response was replayed
    conflict,  // the key was used with another request, or its response is not replayable
    timeout,  // still in progress when the wait budget ran out
    failed,  // 5xx/408/429 (cooldown), a cooldown hit, a store error, an exhausted connection pool, or an outcome that could not be settled
    completed_uncacheable,  // ran; the response was over the cap and stored as not replayable
    unguarded,  // no key: ran without idempotency
    rejected,  // an invalid or missing key, a guarded request without a principal, or a request over the cap
    expired,  // the key finished longer ago than idem.ttl and is not run again
};

// The HTTP status profiles.
enum class status_profile
{
    ietf,
    conflict409,
    seed [[deprecated("seed is conflict409; the old name goes in 0.7.0")]] = conflict409,
};

// The claim's lifecycle events, any number per run (metrics::on_event).
enum class event
{
    claimed,  // won a fresh key
    recovered_ttl,  // won a key whose stored result had expired
    recovered_abandoned,  // won a key from a crashed winner or after a cooldown
    pending_wait,  // a follower started waiting for the winner
    retryable_cooldown,  // answered retryable because the key is in cooldown
    lease_stolen,  // the winner lost its claim before storing its result
    finalize_error,  // storing the result failed
    release_error,  // releasing or failing the claim failed
    unknown_outcome,  // the connection was lost while a commit was in flight
    finalized,  // the winner's result is committed (for wake-up latency)
    pool_exhausted,  // no connection of the application's pool came free in time ([client.pool])
};

// What is wrong with a request's Idempotency-Key, if anything.
enum class key_status
{
    ok,
    absent,
    empty,
    duplicated,
    too_long,
    contains_nul,
    invalid_utf8,
};

// What the winner does with its handler's response.
enum class storage_action
{
    finalize,
    release,
    fail,
};

// What idem::inbox::handle reports for a delivery, also its metrics label.
enum class inbox_outcome
{
    processed,  // the handler ran and its effects committed with the record that the message is processed
    duplicate,  // processed before, or by a concurrent delivery: the handler did not run
    dead,  // attempts used up: its dead letter (topic idem.inbox.dead) is in the outbox; idem_inbox_retry revives it
    mismatch,  // the message id was seen with another payload: nothing was written
    retry,  // the handler or its transaction failed and the failure is recorded
    unknown,  // the connection was lost (also during COMMIT): whether it committed is not known
};

// What a consumer does with a delivery at its broker (protocol::broker_action_of).
enum class broker_action
{
    ack,            // acknowledge it: nothing is left to do with it
    requeue,        // hand it back now: the redelivery settles it
    requeue_after,  // deliver it again after inbox_result::retry_after
};

namespace protocol {

inline constexpr std::string_view key_domain = "pg_idem key v1";
inline constexpr std::size_t max_key_bytes = 255;
inline constexpr std::string_view problem_base = "urn:pg-idem:problem:";
// How many idem::outcome values there are (an array of counters per outcome).
inline constexpr std::size_t outcome_count = 9;
// The oldest extension the runner works with (idem::oldest_extension).
inline constexpr std::string_view oldest_extension = "0.3.0";
// A handler's validation failures: released, not stored, unless
// config::client_errors() is client_errors::store.
inline constexpr std::array<int, 2> validation_statuses = {{400, 422}};

inline constexpr bool is_validation_status(int http_status) noexcept
{
    for (int s : validation_statuses)
        if (s == http_status)
            return true;
    return false;
}

// Problems a client answers instead of running the handler.
enum class problem
{
    missing_key,
    invalid_key,
    key_reused,
    in_progress,
    cooldown,
    not_replayable,
    expired,
    request_too_large,
    store_unavailable,
    pool_exhausted,
    principal_missing,
    outcome_unknown,
};

struct problem_info
{
    std::string_view slug;
    std::string_view title;
    std::string_view detail;  // {key_status}, {limit}: filled in by the caller
    std::array<int, 2> status;  // per status_profile
    bool retry_after;
};

inline constexpr std::array<problem_info, 12> problems = {{
    {"idempotency-key-missing", "Idempotency-Key header is missing", "{key_status}", {400, 400}, false},
    {"idempotency-key-invalid", "Idempotency-Key header is invalid", "{key_status}", {400, 400}, false},
    {"idempotency-key-reused", "Idempotency-Key is already used for a different request", "This key was used with another request body. Use a new key for a new request.", {422, 409}, false},
    {"request-in-progress", "A request with this Idempotency-Key is being processed", "Retry after the delay in Retry-After to get its response.", {409, 503}, true},
    {"request-failed-recently", "The last attempt with this Idempotency-Key failed", "Retry after the delay in Retry-After.", {503, 503}, true},
    {"response-not-replayable", "The request was completed but its response cannot be replayed", "The response was too large to store. Use a new key to repeat the request.", {409, 409}, false},
    {"idempotency-key-expired", "This Idempotency-Key has expired", "The request with this key finished too long ago for its response to be kept. Use a new key to repeat the request.", {410, 409}, false},
    {"request-too-large", "Request body too large", "The request body is over {limit} bytes.", {413, 413}, false},
    {"idempotency-store-unavailable", "Idempotency store unavailable", "The request was not run. Retry after the delay in Retry-After.", {503, 503}, true},
    {"connection-pool-exhausted", "The service's connection pool is exhausted", "The request was not run: no connection of this service's pool to the idempotency store came free in time. Retry after the delay in Retry-After.", {503, 503}, true},
    {"principal-missing", "The request has no authenticated principal", "A request with an Idempotency-Key needs an authenticated principal, which is part of the key. Authenticate the request and retry.", {401, 401}, false},
    {"outcome-unknown", "The outcome of this request is not known yet", "The request may have run, but its result is not recorded yet. Retry after the delay in Retry-After with the same Idempotency-Key.", {503, 503}, true},
}};

inline constexpr const problem_info &info(problem p) noexcept
{
    return problems[static_cast<std::size_t>(p)];
}

inline constexpr int status(problem p, status_profile profile) noexcept
{
    return info(p).status[static_cast<std::size_t>(profile)];
}

// The server's claim outcomes (the outcome column of idem_claim and idem_lookup).
enum class server_outcome
{
    claimed,
    recovered_ttl,
    recovered_abandoned,
    replay,
    mismatch,
    in_progress,
    cooldown,
    not_replayable,
    expired,
    absent,
    claimable,
    unknown,  // not one of the above: a newer server; treated as an error
};

// What a client does with a server outcome.
enum class action
{
    run,
    replay,
    answer,
    wait,
    claim,
};

struct outcome_info
{
    std::string_view name;
    action what;
    problem answer;   // answer, and wait once the budget ends
    bool has_problem;
    outcome result;
};

inline constexpr std::array<outcome_info, 11> outcomes = {{
    {"claimed", action::run, problem::missing_key, false, outcome::won_completed},
    {"recovered_ttl", action::run, problem::missing_key, false, outcome::won_completed},
    {"recovered_abandoned", action::run, problem::missing_key, false, outcome::won_completed},
    {"replay", action::replay, problem::missing_key, false, outcome::replay},
    {"mismatch", action::answer, problem::key_reused, true, outcome::conflict},
    {"in_progress", action::wait, problem::in_progress, true, outcome::timeout},
    {"cooldown", action::answer, problem::cooldown, true, outcome::failed},
    {"not_replayable", action::answer, problem::not_replayable, true, outcome::conflict},
    {"expired", action::answer, problem::expired, true, outcome::expired},
    {"absent", action::claim, problem::missing_key, false, outcome::failed},
    {"claimable", action::claim, problem::missing_key, false, outcome::failed},
}};

// A guarded request without a principal: refused with this problem, counted
// as this result (protocol.toml [client.missing_principal]).
inline constexpr problem missing_principal = problem::principal_missing;
inline constexpr outcome missing_principal_result = outcome::rejected;
// An exhausted connection pool (protocol.toml [client.pool]): the answer,
// its result and metrics event (an [[event]]), the wait of a bounded
// simple_pool, the fix every log line names, the share of a bounded pool
// waiting duplicates may hold at once.
inline constexpr problem pool_exhausted_answer = problem::pool_exhausted;
inline constexpr outcome pool_exhausted_result = outcome::failed;
inline constexpr event pool_exhausted_event = event::pool_exhausted;
inline constexpr std::chrono::milliseconds pool_wait{5000};
inline constexpr std::string_view pool_exhausted_fix = "give the pool more connections than the requests in flight at once (running handlers plus duplicates waiting for them), or lower the follower wait budget so that duplicates give up sooner";
inline constexpr double pool_duplicates_share = 0.5;
// How long runner::check() waits for a server that does not answer
// yet, and the SQLSTATEs it waits through (protocol.toml [client.startup]).
inline constexpr std::chrono::milliseconds startup_wait{10000};
inline constexpr std::array<std::string_view, 2> startup_retry_sqlstates = {{"57P03", "53300"}};
// {SQLSTATE, the server's words (an ECMAScript regex)} of a refused
// connection, which libpq gives without its code.
struct connect_message
{
    std::string_view sqlstate;
    std::string_view pattern;
};
inline constexpr std::array<connect_message, 5> connect_messages = {{
    {"28000", "role \".*\" does not exist|no pg_hba\\.conf entry|is not permitted to log in"},
    {"28P01", "password authentication failed|no password supplied"},
    {"3D000", "database \".*\" does not exist"},
    {"57P03", "the database system is (starting up|shutting down|in recovery mode|not yet accepting connections|not accepting connections)"},
    {"53300", "too many clients already|remaining connection slots are reserved"},
}};

inline server_outcome parse_server_outcome(std::string_view name) noexcept
{
    for (std::size_t i = 0; i < outcomes.size(); ++i)
        if (outcomes[i].name == name)
            return static_cast<server_outcome>(i);
    return server_outcome::unknown;
}

inline constexpr const outcome_info &info(server_outcome o) noexcept
{
    return outcomes[static_cast<std::size_t>(o)];
}

inline constexpr std::string_view name(outcome o) noexcept
{
    switch (o)
    {
    case outcome::won_completed:
        return "won_completed";
    case outcome::replay:
        return "replay";
    case outcome::conflict:
        return "conflict";
    case outcome::timeout:
        return "timeout";
    case outcome::failed:
        return "failed";
    case outcome::completed_uncacheable:
        return "completed_uncacheable";
    case outcome::unguarded:
        return "unguarded";
    case outcome::rejected:
        return "rejected";
    case outcome::expired:
        return "expired";
    }
    return "unknown";
}

inline constexpr std::string_view describe(key_status s) noexcept
{
    switch (s)
    {
    case key_status::ok:
        return "The Idempotency-Key is valid.";
    case key_status::absent:
        return "This operation requires an Idempotency-Key header.";
    case key_status::empty:
        return "The Idempotency-Key header is empty.";
    case key_status::duplicated:
        return "The request has more than one Idempotency-Key header.";
    case key_status::too_long:
        return "The Idempotency-Key is longer than 255 bytes.";
    case key_status::contains_nul:
        return "The Idempotency-Key contains a NUL byte.";
    case key_status::invalid_utf8:
        return "The Idempotency-Key is not valid UTF-8.";
    }
    return "";
}

inline constexpr storage_action classify(int http_status) noexcept
{
    if (http_status >= 200 && http_status <= 299)
        return storage_action::finalize;
    if (http_status == 400)
        return storage_action::finalize;
    if (http_status == 404)
        return storage_action::finalize;
    if (http_status == 409)
        return storage_action::finalize;
    if (http_status == 422)
        return storage_action::finalize;
    if (http_status == 408)
        return storage_action::fail;
    if (http_status == 429)
        return storage_action::fail;
    if (http_status >= 500 && http_status <= 599)
        return storage_action::fail;
    if (http_status >= 100 && http_status <= 499)
        return storage_action::release;
    return storage_action::fail;
}

inline constexpr std::size_t event_count = 11;

inline constexpr std::string_view name(event e) noexcept
{
    switch (e)
    {
    case event::claimed:
        return "claimed";
    case event::recovered_ttl:
        return "recovered_ttl";
    case event::recovered_abandoned:
        return "recovered_abandoned";
    case event::pending_wait:
        return "pending_wait";
    case event::retryable_cooldown:
        return "retryable_cooldown";
    case event::lease_stolen:
        return "lease_stolen";
    case event::finalize_error:
        return "finalize_error";
    case event::release_error:
        return "release_error";
    case event::unknown_outcome:
        return "unknown_outcome";
    case event::finalized:
        return "finalized";
    case event::pool_exhausted:
        return "pool_exhausted";
    }
    return "unknown";
}

// A namespace goes before the target: " " between (an empty namespace is none).
inline std::string namespaced_target(std::string_view ns, std::string_view target)
{
    if (ns.empty())
        return std::string(target);
    std::string out(ns);
    out += " ";
    out += target;
    return out;
}

// What config() is when the builder is told nothing.
namespace defaults {
inline constexpr std::chrono::milliseconds lease = std::chrono::milliseconds{30000};
inline constexpr int renew_divisor = 3;  // renew_interval = lease / renew_divisor
inline constexpr std::chrono::milliseconds follower_wait_budget = std::chrono::milliseconds{5000};
inline constexpr std::chrono::milliseconds poll_min = std::chrono::milliseconds{50};
inline constexpr std::chrono::milliseconds poll_max = std::chrono::milliseconds{1000};
inline constexpr double poll_jitter = 0.25;
inline constexpr std::chrono::milliseconds retry_after = std::chrono::milliseconds{1000};
inline constexpr std::chrono::milliseconds failure_cooldown = std::chrono::milliseconds{2000};
inline constexpr std::size_t max_request_body_bytes = 1048576;
inline constexpr std::size_t max_cacheable_response_bytes = 2097152;
inline constexpr unsigned max_iterations = 100;
inline constexpr unsigned transaction_attempts = 3;
inline constexpr status_profile profile = status_profile::ietf;
inline constexpr std::string_view client_errors = "release";
inline constexpr std::chrono::milliseconds pooled_wait_slice = std::chrono::milliseconds{200};
}  // namespace defaults

// What a configuration may not be.
namespace limits {
inline constexpr std::chrono::milliseconds min_lease = std::chrono::milliseconds{10};
inline constexpr std::chrono::milliseconds max_lease = std::chrono::milliseconds{86400000};
}  // namespace limits

// The header a replayed answer carries (value "true").
inline constexpr std::string_view replayed_header = "Idempotent-Replayed";

// Response headers kept for replay unless configured otherwise.
inline constexpr std::array<std::string_view, 6> default_replay_headers = {{"content-type", "content-disposition", "content-language", "cache-control", "etag", "location"}};

// Never stored, whatever the configuration says.
inline constexpr std::array<std::string_view, 10> never_stored_headers = {{"set-cookie", "set-cookie2", "cookie", "authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate", "x-api-key", "x-csrf-token", "x-xsrf-token"}};

// Nor a header whose lower-case name contains one of these.
inline constexpr std::array<std::string_view, 5> never_stored_header_parts = {{"cookie", "session", "token", "authoriz", "authenticat"}};

// The metrics' series (a Prometheus counter's exported name adds _total).
namespace series {
inline constexpr std::string_view requests_name = "idem_client_requests";
inline constexpr std::string_view requests_help = "Requests through the pg_idem runner, by outcome.";
inline constexpr std::string_view requests_label = "outcome";
inline constexpr std::string_view events_name = "idem_client_events";
inline constexpr std::string_view events_help = "Claim lifecycle events seen by the pg_idem runner.";
inline constexpr std::string_view events_label = "event";
}  // namespace series

// idem_attempts' statuses and failure reasons.
namespace attempt {
inline constexpr std::string_view pending = "pending";
inline constexpr std::string_view stored = "stored";
inline constexpr std::string_view promoted = "promoted";
inline constexpr std::string_view superseded = "superseded";
inline constexpr std::string_view failed = "failed";
inline constexpr std::string_view reaped_no_blob = "reaped_no_blob";
inline constexpr std::string_view digest_mismatch = "digest_mismatch";
inline constexpr std::string_view target_gone = "target_gone";
}  // namespace attempt

// The answers of idem_inbox_begin and idem_inbox_fail.
enum class inbox_answer
{
    process,  // from begin
    duplicate,  // from begin, fail
    dead,  // from begin, fail
    mismatch,  // from begin
    retry,  // from fail
    unknown,  // not one of the above: a newer server; treated as an error
};

inline constexpr std::array<std::string_view, 5> inbox_answers = {{"process", "duplicate", "dead", "mismatch", "retry"}};

inline inbox_answer parse_inbox_answer(std::string_view text) noexcept
{
    for (std::size_t i = 0; i < inbox_answers.size(); ++i)
        if (inbox_answers[i] == text)
            return static_cast<inbox_answer>(i);
    return inbox_answer::unknown;
}

// The consumer's result for a server answer (process: once done commits).
inline constexpr inbox_outcome result_of(inbox_answer a) noexcept
{
    switch (a)
    {
    case inbox_answer::process:
        return inbox_outcome::processed;
    case inbox_answer::duplicate:
        return inbox_outcome::duplicate;
    case inbox_answer::dead:
        return inbox_outcome::dead;
    case inbox_answer::mismatch:
        return inbox_outcome::mismatch;
    case inbox_answer::retry:
        return inbox_outcome::retry;
    case inbox_answer::unknown:
        break;
    }
    return inbox_outcome::unknown;
}

inline constexpr std::string_view name(inbox_outcome o) noexcept
{
    switch (o)
    {
    case inbox_outcome::processed:
        return "processed";
    case inbox_outcome::duplicate:
        return "duplicate";
    case inbox_outcome::dead:
        return "dead";
    case inbox_outcome::mismatch:
        return "mismatch";
    case inbox_outcome::retry:
        return "retry";
    case inbox_outcome::unknown:
        return "unknown";
    }
    return "unknown";
}

inline constexpr broker_action broker_action_of(inbox_outcome o) noexcept
{
    switch (o)
    {
    case inbox_outcome::processed:
        return broker_action::ack;
    case inbox_outcome::duplicate:
        return broker_action::ack;
    case inbox_outcome::dead:
        return broker_action::ack;
    case inbox_outcome::mismatch:
        return broker_action::ack;
    case inbox_outcome::retry:
        return broker_action::requeue_after;
    case inbox_outcome::unknown:
        return broker_action::requeue;
    }
    return broker_action::requeue;
}

inline constexpr int inbox_default_max_attempts = 5;
inline constexpr int inbox_max_attempts = 1000;

// The answers of idem_outbox_nack.
enum class nack_outcome
{
    retry,  // attempts left: claimable again after the backoff (idem.outbox_backoff's step for its attempt)
    dead,  // that was its last attempt (idem.outbox_max_attempts): dead, it no longer holds its key back
    stale,  // the token no longer holds the event (its lease ran out and another claim took it, or it was acked); nothing changed
    unknown,  // not one of the above: a newer server
};

inline nack_outcome parse_nack_outcome(std::string_view text) noexcept
{
    if (text == "retry")
        return nack_outcome::retry;
    if (text == "dead")
        return nack_outcome::dead;
    if (text == "stale")
        return nack_outcome::stale;
    return nack_outcome::unknown;
}

// The metric names of the consumers and relays (one series per inbox_outcome and
// per batch_report count).
inline constexpr std::string_view inbox_metric = "idem_client_inbox_messages_total";
inline constexpr std::string_view relay_metric = "idem_client_outbox_events_total";
inline constexpr std::array<std::string_view, 10> relay_counts = {{"claimed", "published", "acked", "lease_lost", "retried", "dead", "stale", "held_back", "expired", "abandoned"}};

}  // namespace protocol
}  // namespace idem
