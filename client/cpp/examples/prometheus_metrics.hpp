// A ready idem::metrics for Prometheus: counters of every outcome and event,
// rendered in Prometheus' text exposition format for the application's own
// /metrics endpoint. Header-only, no dependency; copy it into your service.
//
//   static prometheus_metrics idem_metrics;
//   idem::runner run(pool, cfg, &idem_metrics);
//   ... on GET /metrics: respond 200, "text/plain; version=0.0.4", idem_metrics.render()
#pragma once

#include <idem/metrics.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <string>

class prometheus_metrics final : public idem::metrics
{
public:
    void on_outcome(idem::outcome o) override { outcomes_[static_cast<std::size_t>(o)]++; }
    void on_event(idem::event e) override { events_[static_cast<std::size_t>(e)]++; }

    // Every series, zeros included, so that rate() sees each from the start.
    std::string render() const
    {
        std::string out =
            "# HELP idem_client_requests_total Requests through the pg_idem runner, by outcome.\n"
            "# TYPE idem_client_requests_total counter\n";
        for (std::size_t i = 0; i < outcomes_.size(); ++i)
            out += "idem_client_requests_total{outcome=\"" +
                   std::string(idem::to_string(static_cast<idem::outcome>(i))) + "\"} " +
                   std::to_string(outcomes_[i].load()) + "\n";
        out += "# HELP idem_client_events_total Claim lifecycle events seen by the pg_idem runner.\n"
               "# TYPE idem_client_events_total counter\n";
        for (std::size_t i = 0; i < events_.size(); ++i)
            out += "idem_client_events_total{event=\"" +
                   std::string(idem::to_string(static_cast<idem::event>(i))) + "\"} " +
                   std::to_string(events_[i].load()) + "\n";
        return out;
    }

private:
    // Sized by the protocol: 0.4.0 sized it by `rejected`, the last outcome
    // before `expired`, and counted expired past its end.
    std::array<std::atomic<unsigned long long>, idem::protocol::outcome_count> outcomes_{};
    std::array<std::atomic<unsigned long long>, static_cast<std::size_t>(idem::event::pool_exhausted) + 1>
        events_{};
};
