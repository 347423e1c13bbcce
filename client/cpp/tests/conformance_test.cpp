// The conformance test every client runs: client/conformance/protocol.json
// (generated from extension/protocol/protocol.toml) says, for every server
// outcome in every status profile, what a client does (action), what it
// answers (status, problem type, Retry-After) and its run result; how a
// handler's status is stored; the key-status sentences; the cache-key and
// request-hash vectors; the defaults and limits, the namespace's place in
// the key, the replay headers, the metrics' series and events and the
// profiles. The Python and Node suites read the same file.
#include <idem/config.hpp>
#include <idem/http.hpp>
#include <idem/inbox.hpp>
#include <idem/key.hpp>
#include <idem/metrics.hpp>
#include <idem/outbox.hpp>
#include <idem/protocol.hpp>
#include <idem/version.hpp>

#include "../examples/prometheus_metrics.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

using namespace idem;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const json &conformance()
{
    static const json doc = [] {
        std::ifstream in(IDEM_CONFORMANCE_FILE);
        if (!in)
            throw std::runtime_error("cannot read " IDEM_CONFORMANCE_FILE);
        return json::parse(in);
    }();
    return doc;
}

status_profile profile_named(const std::string &name)
{
    if (name == "ietf")
        return status_profile::ietf;
    if (name == "conflict409")
        return status_profile::conflict409;
    throw std::runtime_error("unknown profile " + name);
}

std::string action_name(protocol::action a)
{
    switch (a)
    {
    case protocol::action::run:
        return "run";
    case protocol::action::replay:
        return "replay";
    case protocol::action::answer:
        return "answer";
    case protocol::action::wait:
        return "wait";
    case protocol::action::claim:
        return "claim";
    }
    return "?";
}

std::string storage_name(storage_action a)
{
    switch (a)
    {
    case storage_action::finalize:
        return "finalize";
    case storage_action::release:
        return "release";
    case storage_action::fail:
        return "fail";
    }
    return "?";
}

key_status key_status_named(const std::string &name)
{
    static const std::pair<const char *, key_status> names[] = {
        {"ok", key_status::ok},
        {"absent", key_status::absent},
        {"empty", key_status::empty},
        {"duplicated", key_status::duplicated},
        {"too_long", key_status::too_long},
        {"contains_nul", key_status::contains_nul},
        {"invalid_utf8", key_status::invalid_utf8},
    };
    for (const auto &[n, s] : names)
        if (name == n)
            return s;
    throw std::runtime_error("unknown key status " + name);
}

}  // namespace

// Every outcome x profile: the action, and for an answer (or a wait whose
// budget is over) the status, the problem type and Retry-After, and the
// run result.
TEST(Conformance, EveryOutcomeInEveryProfile)
{
    const json &cases = conformance().at("outcomes");
    ASSERT_FALSE(cases.empty());
    for (const json &c : cases)
    {
        const std::string name = c.at("outcome");
        SCOPED_TRACE(name + " / " + c.at("profile").get<std::string>());
        const protocol::server_outcome o = protocol::parse_server_outcome(name);
        ASSERT_NE(o, protocol::server_outcome::unknown);
        const protocol::outcome_info &info = protocol::info(o);
        EXPECT_EQ(action_name(info.what), c.at("action").get<std::string>());
        if (c.contains("result"))
        {
            EXPECT_EQ(std::string(protocol::name(info.result)), c.at("result").get<std::string>());
        }
        const std::optional<response> r =
            problems::for_outcome(o, profile_named(c.at("profile")), std::chrono::milliseconds(1500));
        if (!c.contains("status"))
        {
            EXPECT_FALSE(r.has_value()) << "answered " << r->status;
            continue;
        }
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->status, c.at("status").get<int>());
        EXPECT_EQ(r->header_value("content-type").value_or(""), "application/problem+json");
        const json body = json::parse(r->body);
        EXPECT_EQ(body.at("type").get<std::string>(), c.at("type").get<std::string>());
        EXPECT_EQ(body.at("status").get<int>(), r->status);
        EXPECT_EQ(r->header_value("retry-after").has_value(), c.at("retry_after").get<bool>());
        if (c.at("retry_after").get<bool>())
        {
            EXPECT_EQ(r->header_value("retry-after").value_or(""), "2");  // 1.5 s, rounded up
        }
    }
    // No server outcome the client knows is missing from the file.
    EXPECT_EQ(cases.size(), 2 * protocol::outcomes.size());
}

TEST(Conformance, StorageOfEveryStatus)
{
    for (const json &c : conformance().at("storage"))
    {
        SCOPED_TRACE(c.dump());
        EXPECT_EQ(storage_name(classify(c.at("status").get<int>())), c.at("action").get<std::string>());
    }
}

// The oldest extension the runner accepts and the validation statuses are
// the protocol's, as in the other clients: the storage rules finalize
// those statuses, and the runner releases them by default and stores them
// with client_errors::store (as Python's client_errors = "store" and
// Node's storeClientErrors).
TEST(Conformance, ClientDefaults)
{
    const json &c = conformance().at("client");
    EXPECT_EQ(std::string(oldest_extension), c.at("oldest_extension").get<std::string>());
    EXPECT_EQ(std::string(protocol::oldest_extension), c.at("oldest_extension").get<std::string>());
    const std::vector<int> statuses = c.at("validation_statuses").get<std::vector<int>>();
    ASSERT_FALSE(statuses.empty());
    EXPECT_EQ(std::vector<int>(protocol::validation_statuses.begin(), protocol::validation_statuses.end()),
              statuses);
    EXPECT_EQ(config().client_errors(), client_errors::release);
    for (int s : statuses)
    {
        EXPECT_TRUE(protocol::is_validation_status(s)) << s;
        EXPECT_EQ(classify(s), storage_action::finalize) << "the rules store " << s;
        EXPECT_EQ(classify(s, client_errors::release), storage_action::release) << "released by default: " << s;
        EXPECT_EQ(classify(s, client_errors::store), storage_action::finalize) << "stored with store: " << s;
    }
    // Only those: every other status is the storage rules' under either setting.
    for (const json &r : conformance().at("storage"))
    {
        const int s = r.at("status").get<int>();
        if (std::find(statuses.begin(), statuses.end(), s) != statuses.end())
            continue;
        EXPECT_FALSE(protocol::is_validation_status(s)) << s;
        EXPECT_EQ(storage_name(classify(s, client_errors::release)), r.at("action").get<std::string>()) << s;
        EXPECT_EQ(storage_name(classify(s, client_errors::store)), r.at("action").get<std::string>()) << s;
    }
}

TEST(Conformance, KeyStatusSentences)
{
    for (const auto &[name, sentence] : conformance().at("key_statuses").items())
        EXPECT_EQ(std::string(describe(key_status_named(name))), sentence.get<std::string>()) << name;
}

// The shared cache-key vectors: the server's idem_key() gives the same
// (sql/key_vectors.sql), and so do the Python and Node clients.
TEST(Conformance, CacheKeyVectors)
{
    const json &vs = conformance().at("key_vectors");
    ASSERT_FALSE(vs.empty());
    for (const json &v : vs)
    {
        SCOPED_TRACE(v.dump());
        EXPECT_EQ(to_hex(cache_key(v.at("principal").get<std::string>(),
                                   v.at("method").get<std::string>(),
                                   v.at("target").get<std::string>(), v.at("key").get<std::string>())),
                  v.at("cache_key").get<std::string>());
    }
}

TEST(Conformance, RequestHashVectors)
{
    for (const json &v : conformance().at("request_hash_vectors"))
        EXPECT_EQ(to_hex(request_hash(v.at("body").get<std::string>())),
                  v.at("request_hash").get<std::string>());
}

// The metrics series are labelled with the protocol's outcome names, one
// series per outcome (the Python and Node clients expose the same names).
TEST(Conformance, MetricsHaveASeriesPerOutcome)
{
    prometheus_metrics m;
    m.on_outcome(outcome::expired);  // the last outcome: 0.4.0 counted it past the array's end
    const std::string text = m.render();
    for (std::size_t i = 0; i < protocol::outcome_count; ++i)
    {
        const std::string label(protocol::name(static_cast<outcome>(i)));
        const std::string series = "idem_client_requests_total{outcome=\"" + label + "\"} ";
        EXPECT_NE(text.find(series + (label == "expired" ? "1" : "0")), std::string::npos) << label;
    }
}

// config() is the protocol's defaults, and build() refuses what its limits refuse.
TEST(Conformance, DefaultsAndLimits)
{
    const json &d = conformance().at("client").at("defaults");
    const json &lim = conformance().at("client").at("limits");
    const config c;
    const auto ms = [&](const char *k) { return milliseconds(d.at(k).get<long long>()); };
    EXPECT_EQ(c.lease(), ms("lease_ms"));
    EXPECT_EQ(c.renew_interval(), c.lease() / d.at("renew_divisor").get<int>());
    EXPECT_EQ(config::builder().lease(9000ms).build().renew_interval(), 9000ms / d.at("renew_divisor").get<int>());
    EXPECT_EQ(c.follower_wait_budget(), ms("follower_wait_budget_ms"));
    EXPECT_EQ(c.poll_min(), ms("poll_min_ms"));
    EXPECT_EQ(c.poll_max(), ms("poll_max_ms"));
    EXPECT_DOUBLE_EQ(c.poll_jitter(), d.at("poll_jitter").get<double>());
    EXPECT_EQ(c.retry_after(), ms("retry_after_ms"));
    EXPECT_EQ(c.failure_cooldown(), ms("failure_cooldown_ms"));
    EXPECT_EQ(c.max_request_body_bytes(), d.at("max_request_body_bytes").get<std::size_t>());
    EXPECT_EQ(c.max_cacheable_response_bytes(), d.at("max_cacheable_response_bytes").get<std::size_t>());
    EXPECT_EQ(c.max_iterations(), d.at("max_iterations").get<unsigned>());
    EXPECT_EQ(c.transaction_attempts(), d.at("transaction_attempts").get<unsigned>());
    EXPECT_EQ(c.profile(), profile_named(d.at("profile").get<std::string>()));
    EXPECT_EQ(c.client_errors() == client_errors::store, d.at("client_errors").get<std::string>() == "store");
    EXPECT_EQ(config::pooled_wait_slice, ms("pooled_wait_slice_ms"));
    const milliseconds min_lease(lim.at("min_lease_ms").get<long long>());
    const milliseconds max_lease(lim.at("max_lease_ms").get<long long>());
    EXPECT_EQ(config::builder().lease(min_lease).renew_interval(1ms).build().lease(), min_lease);
    EXPECT_THROW(config::builder().lease(min_lease - 1ms).build(), config_error);
    EXPECT_THROW(config::builder().lease(max_lease + 1ms).build(), config_error);
}

// The profiles, and the deprecated name of one, which still compiles (with a warning).
TEST(Conformance, Profiles)
{
    std::vector<std::string> names;
    for (const json &p : conformance().at("profiles"))
        names.push_back(p.get<std::string>());
    EXPECT_EQ(names, (std::vector<std::string>{"ietf", "conflict409"}));
    for (const auto &[old, now] : conformance().at("deprecated_profiles").items())
    {
        EXPECT_EQ(old, "seed");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        EXPECT_EQ(status_profile::seed, profile_named(now.at("profile").get<std::string>()));
#pragma GCC diagnostic pop
    }
}

// The runner's key with key_namespace is the vector's (the engine's own
// computation: a partitioned runner routes by the same key).
TEST(Conformance, NamespaceGoesWhereTheProtocolSays)
{
    for (const json &v : conformance().at("namespace_vectors"))
    {
        SCOPED_TRACE(v.dump());
        const std::string ns = v.at("namespace").is_null() ? "" : v.at("namespace").get<std::string>();
        const std::string target = v.at("target").get<std::string>();
        EXPECT_EQ(protocol::namespaced_target(ns, target), v.at("namespaced_target").get<std::string>());
        EXPECT_EQ(to_hex(cache_key(v.at("principal").get<std::string>(), v.at("method").get<std::string>(),
                                   protocol::namespaced_target(config::builder().key_namespace(ns).build().key_namespace(),
                                                               target),
                                   v.at("key").get<std::string>())),
                  v.at("cache_key").get<std::string>());
    }
    EXPECT_THROW(config::builder().key_namespace("two words").build(), config_error);
}

TEST(Conformance, ReplayHeaders)
{
    const json &rh = conformance().at("replay_headers");
    EXPECT_EQ(std::string(replay_header_name), rh.at("replayed_header").get<std::string>());
    const header_allowlist by_default;
    for (const json &v : rh.at("vectors"))
    {
        const std::string name = v.at("name").get<std::string>();
        SCOPED_TRACE(name);
        EXPECT_EQ(by_default.allows(name), v.at("by_default").get<bool>());
        if (v.at("when_configured").get<bool>())
            EXPECT_TRUE(header_allowlist(config::builder().replay_header(name).build()).allows(name));
        else
            EXPECT_THROW(config::builder().replay_header(name).build(), config_error);
        EXPECT_EQ(is_never_stored(name), !v.at("when_configured").get<bool>());
    }
}

// The example exporter's series and labels are the protocol's, every event
// at zero from the start.
TEST(Conformance, MetricsSeriesAndEvents)
{
    const json &events = conformance().at("events");
    ASSERT_EQ(events.size(), protocol::event_count);
    for (std::size_t i = 0; i < protocol::event_count; ++i)
        EXPECT_EQ(std::string(to_string(static_cast<event>(i))), events[i].get<std::string>());
    const std::string text = prometheus_metrics().render();
    for (const char *kind : {"requests", "events"})
    {
        const json &s = conformance().at("metrics").at(kind);
        const std::string name = s.at("name").get<std::string>() + "_total";
        EXPECT_NE(text.find("# HELP " + name + " " + s.at("help").get<std::string>() + "\n"), std::string::npos);
        EXPECT_NE(text.find(name + "{" + s.at("label").get<std::string>() + "=\""), std::string::npos);
    }
    for (const json &e : events)
        EXPECT_NE(text.find("idem_client_events_total{event=\"" + e.get<std::string>() + "\"} 0"), std::string::npos);
}

TEST(Conformance, InboxAnswersResultsAndBrokerActions)
{
    const json &m = conformance().at("messaging");
    for (const json &a : m.at("inbox_answers"))
    {
        const auto answer = protocol::parse_inbox_answer(a.at("name").get<std::string>());
        ASSERT_NE(answer, protocol::inbox_answer::unknown) << a;
        EXPECT_EQ(protocol::name(protocol::result_of(answer)), a.at("result").get<std::string>()) << a;
    }
    EXPECT_EQ(protocol::parse_inbox_answer("no such answer"), protocol::inbox_answer::unknown);
    const char *actions[] = {"ack", "requeue", "requeue_after"};
    std::size_t results = 0;
    for (const json &r : m.at("inbox_results"))
    {
        const auto o = static_cast<inbox_outcome>(results++);
        EXPECT_EQ(to_string(o), r.at("name").get<std::string>());
        EXPECT_EQ(actions[static_cast<int>(protocol::broker_action_of(o))], r.at("broker").get<std::string>()) << r;
    }
    EXPECT_EQ(to_string(inbox_outcome::unknown), std::string("unknown"));
    EXPECT_EQ(protocol::inbox_max_attempts, m.at("inbox").at("max_attempts").get<int>());
    EXPECT_EQ(inbox_settings{}.max_attempts, m.at("inbox").at("default_max_attempts").get<int>());
}

TEST(Conformance, NackOutcomesAndRelayCounts)
{
    const json &m = conformance().at("messaging");
    for (const json &n : m.at("nack_outcomes"))
        EXPECT_NE(protocol::parse_nack_outcome(n.at("name").get<std::string>()), protocol::nack_outcome::unknown) << n;
    EXPECT_EQ(protocol::parse_nack_outcome("later"), protocol::nack_outcome::unknown);
    // batch_report has a field per relay count, in the protocol's order.
    batch_report r;
    std::size_t *fields[] = {&r.claimed, &r.published, &r.acked, &r.lease_lost, &r.retried,
                             &r.dead, &r.stale, &r.held_back, &r.expired, &r.abandoned};
    ASSERT_EQ(m.at("relay_counts").size(), std::size(fields));
    for (std::size_t i = 0; i < std::size(fields); ++i)
        EXPECT_EQ(protocol::relay_counts[i], m.at("relay_counts")[i].get<std::string>());
}
