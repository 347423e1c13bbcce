// pg_idem C++ client: metrics callbacks (no-op by default).
#pragma once

#include <idem/protocol.hpp>

namespace idem {

// idem::outcome, exactly one per run() call, and idem::event, any number
// per run() call, are the protocol's (idem/protocol.hpp): their names are
// the metrics' labels, the same in every client.

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
