// pg_idem C++ client: metrics callbacks (no-op by default).
#pragma once

#include <idem/protocol.hpp>

namespace idem {

// idem::outcome, exactly one per run() call, is the protocol's
// (idem/protocol.hpp): its names are the metrics' outcome labels.

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
    finalized,            // the winner's result is committed (for wake-up latency)
    pool_exhausted        // no connection of the pool came free (protocol::pool_exhausted_event)
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
