// pg_idem C++ client: the sender's side of the Idempotency-Key protocol.
//
// Whoever *sends* a request that must not take effect twice mints one key
// per logical operation and sends it, unchanged, on every retry; the
// server (the runner) then runs the operation once and replays its answer.
// retry_policy does that for any transport: it calls your function with the
// key and the attempt number, and decides from the status (or the transport
// error) whether and when to try again.
//
//   idem::sender::retry_policy policy;                  // 5 attempts, 100 ms .. 5 s backoff
//   httplib::Response last;                              // (cpp-httplib here; any transport)
//   idem::sender::result r = policy.run([&](const std::string &key, unsigned attempt) {
//       auto res = http.Post("/payments", {{"Idempotency-Key", key}}, body, "application/json");
//       if (!res)
//           return idem::sender::attempt_result::transport_error();
//       last = *res;                                     // keep what you need of the answer
//       std::optional<std::string> retry_after;
//       if (res->has_header("Retry-After"))
//           retry_after = res->get_header_value("Retry-After");
//       return idem::sender::attempt_result::response(res->status, retry_after);
//   });
//   // r.key, r.attempts, r.why; `last` is the final answer.
//
// Retried: transport errors (no response read: connect failure, timeout,
// reset; the key makes it safe to send again), 408, 425, 429, 500, 502,
// 503, 504, and 409 when it carries a Retry-After (the IETF profile's
// "still in progress"; a 409 without one is a real conflict). Everything
// else, 2xx and the 422 of a key reused with another body included, is the
// final answer.
//
// The pause before attempt n+1 is the exponential backoff
// initial_backoff * 2^(n-1), capped at max_backoff, of which a random
// `jitter` fraction is taken off (so a crowd of senders spreads out); a
// Retry-After (delta-seconds or an HTTP-date) is a lower bound on it. A
// Retry-After longer than max_retry_after ends the retries at once rather
// than retry early.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

// A fresh UUIDv7 (RFC 9562) in its 36-character lower-case text form: a
// 48-bit Unix timestamp in milliseconds, then 74 bits from OpenSSL's
// CSPRNG (RAND_bytes). Keys minted in one process never go back in time,
// even when the wall clock does. Throws std::runtime_error if the CSPRNG
// fails.
std::string uuid_v7();
// The same layout from given parts: the timestamp (its low 48 bits) and 10
// random bytes, whose version and variant bits are overwritten.
std::string uuid_v7(std::uint64_t unix_ms, const std::array<std::uint8_t, 10> &random);

namespace sender {

using std::chrono::milliseconds;

// What one attempt produced, as the transport saw it.
struct attempt_result
{
    // The HTTP status; empty when no response was read (transport error).
    std::optional<int> status;
    // The Retry-After field value, when the response had one.
    std::optional<std::string> retry_after;

    static attempt_result transport_error() { return {}; }
    static attempt_result response(int status, std::optional<std::string> retry_after = std::nullopt)
    {
        return attempt_result{status, std::move(retry_after)};
    }
};

// Whether a response with this status is worth sending again with the same
// key (has_retry_after: the response carried a valid Retry-After).
bool retryable_status(int status, bool has_retry_after) noexcept;

// A Retry-After value as a wait from `now`: delta-seconds, or an HTTP-date
// in any of the three forms RFC 9110 makes recipients accept (IMF-fixdate,
// RFC 850, asctime). A date in the past is a wait of 0. nullopt when the
// value is malformed. Delta-seconds saturate at 2^31 s.
std::optional<milliseconds> parse_retry_after(
    std::string_view value,
    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

struct settings
{
    unsigned max_attempts = 5;             // attempts in all, the first included (>= 1)
    milliseconds initial_backoff{100};     // backoff before the second attempt; doubles after
    milliseconds max_backoff{5000};        // cap of the backoff (>= initial_backoff)
    double jitter = 0.5;                   // random fraction taken off the backoff, in [0, 1]
    milliseconds max_retry_after{60000};   // a longer Retry-After ends the retries
};

// Why the policy stopped, or that it goes on.
enum class verdict
{
    retry,                 // send again after `delay`
    done,                  // a final answer (not retryable)
    attempts_exhausted,    // retryable, but max_attempts were made
    retry_after_too_long   // retryable, but the server asked to wait over max_retry_after
};
const char *to_string(verdict v) noexcept;

struct decision
{
    verdict what = verdict::done;
    milliseconds delay{0};  // only for verdict::retry
};

// The end of one logical operation.
struct result
{
    attempt_result last;   // what the last attempt produced
    std::string key;       // the Idempotency-Key every attempt carried
    unsigned attempts = 0;
    verdict why = verdict::done;
    milliseconds waited{0};  // total pause between attempts
};

// Stateless apart from its settings and hooks: one policy may serve many
// threads and operations (the hooks must then be thread safe; the defaults
// are).
class retry_policy
{
public:
    // Sends attempt `attempt` (1-based) of an operation with `key`.
    using attempt_fn = std::function<attempt_result(const std::string &key, unsigned attempt)>;
    using sleep_fn = std::function<void(milliseconds)>;
    using clock_fn = std::function<std::chrono::system_clock::time_point()>;
    using random_fn = std::function<double()>;  // uniform in [0, 1)

    // Throws idem::config_error naming a bad setting.
    explicit retry_policy(settings s = settings());

    // Hooks for tests and event loops: how to pause (default: sleep the
    // thread), the clock HTTP-dates are read against, the jitter source.
    retry_policy &sleep_with(sleep_fn f);
    retry_policy &clock_with(clock_fn f);
    retry_policy &random_with(random_fn f);

    // What to do after attempt `attempt` (1-based) produced r. For callers
    // that run their own loop (an event loop cannot block in run()).
    decision next(const attempt_result &r, unsigned attempt) const;

    // One logical operation: mints a UUIDv7 key, then sends and retries
    // with that key until a final answer or a stop. An exception thrown by
    // send propagates (report transport failures as transport_error()).
    result run(const attempt_fn &send) const;
    // The same with the caller's key (one it minted and persisted earlier,
    // so a sender that restarts still retries with it).
    result run(std::string key, const attempt_fn &send) const;

    const settings &configuration() const noexcept { return s_; }

private:
    milliseconds backoff(unsigned attempt) const;

    settings s_;
    sleep_fn sleep_;
    clock_fn clock_;
    random_fn random_;
};

}  // namespace sender
}  // namespace idem
