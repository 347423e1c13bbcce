// Shared by the integration tests and the helper binary: the test database
// and small utilities.
#pragma once

#include <idem/runner.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <string>

namespace idem_test {

// PG_IDEM_TEST_DSN, or "" when integration tests must be skipped.
std::string base_dsn();

// The DSN of this binary's own database (idem_client_test), created on first
// use with a fresh pg_idem and the tables the tests write to.
const std::string &dsn();

// dsn with one conninfo keyword replaced or added (URIs are accepted).
std::string dsn_with(const std::string &dsn, const std::string &keyword, const std::string &value);

// config::builder() for the tests: unnamed prepared statements when
// PG_IDEM_TEST_POOLER is set (the DSN points at a transaction-mode pooler,
// tests/suites/65_pooling.sh).
idem::config::builder config_builder();

// A key no other test (or earlier run) uses.
std::string unique_key(const std::string &prefix);

// Rows in effects (or another table with a key column) for key.
long long count_rows(const std::string &table, const std::string &key);

// The server's idem_stats counter of this name (the library is preloaded in
// the test clusters).
long long server_counter(const std::string &name);

// Waits until the counter reaches at_least: what a test waits for instead
// of a fixed sleep.  Fails the test after a deadline generous enough for a
// loaded machine.
void wait_for_counter(const std::string &name, long long at_least);

// A POST request for the runner, with the cache key and request hash the
// server stores for it.
struct test_request
{
    std::string key;
    std::string body = "{\"amount\":5}";
    std::string principal = "alice";
    std::string target = "/orders";
    bool key_required = false;

    idem::request_view view() const
    {
        idem::request_view v;
        v.principal = principal;
        v.method = "POST";
        v.target = target;
        v.idempotency_keys = {key};
        v.body = body;
        v.key_required = key_required;
        return v;
    }
    std::string ck() const
    {
        return idem::to_bytes(idem::cache_key(principal, "POST", target, key));
    }
    std::string rh() const { return idem::to_bytes(idem::request_hash(body)); }
};

// Counts every outcome and event.
class counting_metrics : public idem::metrics
{
public:
    void on_outcome(idem::outcome o) override { outcomes_[static_cast<int>(o)]++; }
    void on_event(idem::event e) override { events_[static_cast<int>(e)]++; }
    int count(idem::outcome o) const { return outcomes_[static_cast<int>(o)].load(); }
    int count(idem::event e) const { return events_[static_cast<int>(e)].load(); }
    int total_outcomes() const
    {
        int n = 0;
        for (const auto &a : outcomes_)
            n += a.load();
        return n;
    }

private:
    std::array<std::atomic<int>, 16> outcomes_{};
    std::array<std::atomic<int>, 16> events_{};
};

}  // namespace idem_test

#define IDEM_REQUIRE_DB()                                                       \
    do                                                                          \
    {                                                                           \
        if (idem_test::base_dsn().empty())                                      \
            GTEST_SKIP() << "PG_IDEM_TEST_DSN is not set: integration test skipped"; \
    } while (0)
