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
#include <string_view>

class prometheus_metrics final : public idem::metrics
{
public:
    void on_outcome(idem::outcome o) override { outcomes_[static_cast<std::size_t>(o)]++; }
    void on_event(idem::event e) override { events_[static_cast<std::size_t>(e)]++; }

    // Every series, zeros included, so that rate() sees each from the start.
    // The series are the protocol's (idem::protocol::series), the same in
    // every client.
    std::string render() const
    {
        namespace series = idem::protocol::series;
        std::string out;
        header(out, series::requests_name, series::requests_help);
        for (std::size_t i = 0; i < outcomes_.size(); ++i)
            sample(out, series::requests_name, series::requests_label,
                   idem::to_string(static_cast<idem::outcome>(i)), outcomes_[i].load());
        header(out, series::events_name, series::events_help);
        for (std::size_t i = 0; i < events_.size(); ++i)
            sample(out, series::events_name, series::events_label,
                   idem::to_string(static_cast<idem::event>(i)), events_[i].load());
        return out;
    }

private:
    static void header(std::string &out, std::string_view name, std::string_view help)
    {
        out.append("# HELP ").append(name).append("_total ").append(help).append("\n");
        out.append("# TYPE ").append(name).append("_total counter\n");
    }
    static void sample(std::string &out, std::string_view name, std::string_view label, const char *value,
                       unsigned long long n)
    {
        out.append(name).append("_total{").append(label).append("=\"").append(value).append("\"} ");
        out.append(std::to_string(n)).append("\n");
    }

    // Sized by the protocol: 0.4.0 sized it by `rejected`, the last outcome
    // before `expired`, and counted expired past its end.
    std::array<std::atomic<unsigned long long>, idem::protocol::outcome_count> outcomes_{};
    std::array<std::atomic<unsigned long long>, idem::protocol::event_count> events_{};
};
