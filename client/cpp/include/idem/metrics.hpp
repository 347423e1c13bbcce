// pg_idem C++ client: metrics callbacks (no-op by default).
#pragma once

namespace idem {

// Exactly one per run() call.
enum class outcome
{
    won_completed,          // this request ran the handler and recorded the result
    replay,                 // a stored response was replayed
    conflict,               // key reused with another request, or stored not replayable
    timeout,                // still in progress when the wait budget ran out
    failed,                 // 5xx/408/429 (cooldown), cooldown hit, store error, unresolved outcome
    completed_uncacheable,  // ran; the response was over the cap and stored not replayable
    unguarded,              // no key: ran without idempotency
    rejected,               // invalid or missing key, or request over the cap
    expired                 // the key finished longer ago than idem.ttl and is not run again
};

// Any number per run() call.
enum class event
{
    claimed,              // won a fresh key
    recovered_ttl,        // won a key whose stored result had expired
    recovered_abandoned,  // won a key from a crashed winner or after a cooldown
    pending_wait,         // a follower started waiting for the winner
    retryable_cooldown,   // answered retryable because the key is in cooldown
    lease_stolen,         // the winner lost its claim before storing its result
    finalize_error,       // storing the result failed
    release_error,        // releasing or failing the claim failed
    unknown_outcome,      // the connection was lost while a commit was in flight
    finalized             // the winner's result is committed (for wake-up latency)
};

const char *to_string(outcome o) noexcept;
const char *to_string(event e) noexcept;

// Implement to count outcomes and events (Prometheus counters, logs ...).
// Called from the thread running the request; must be thread safe if the
// runner is shared between threads.
class metrics
{
public:
    virtual ~metrics() = default;
    virtual void on_outcome(outcome) {}
    virtual void on_event(event) {}
};

}  // namespace idem
