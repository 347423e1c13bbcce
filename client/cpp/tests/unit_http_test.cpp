// Status matrix, header allowlist and problem-details bodies.
#include <idem/http.hpp>
#include <idem/metrics.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using idem::storage_action;
using namespace std::chrono_literals;

TEST(StatusMatrix, EveryStatus)
{
    for (int s = 100; s <= 599; ++s)
    {
        storage_action want;
        if ((s >= 200 && s <= 299) || s == 400 || s == 404 || s == 409 || s == 422)
            want = storage_action::finalize;
        else if (s >= 500 || s == 408 || s == 429)
            want = storage_action::fail;
        else
            want = storage_action::release;  // 1xx, 3xx, 401, 403, other 4xx
        EXPECT_EQ(idem::classify(s), want) << "status " << s;
    }
    EXPECT_EQ(idem::classify(201), storage_action::finalize);
    EXPECT_EQ(idem::classify(302), storage_action::release);
    EXPECT_EQ(idem::classify(401), storage_action::release);
    EXPECT_EQ(idem::classify(403), storage_action::release);
    EXPECT_EQ(idem::classify(503), storage_action::fail);
    EXPECT_EQ(idem::classify(0), storage_action::fail);
    EXPECT_EQ(idem::classify(600), storage_action::fail);
}

TEST(Headers, AllowlistDefaultsAndNeverStored)
{
    idem::header_allowlist allow;
    for (const char *h : {"content-type", "Content-Disposition", "content-language", "Cache-Control",
                          "ETag", "Location"})
        EXPECT_TRUE(allow.allows(h)) << h;
    for (const char *h : {"Set-Cookie", "authorization", "X-Session-Id", "Proxy-Authorization",
                          "x-auth-token", "WWW-Authenticate", "x-custom"})
        EXPECT_FALSE(allow.allows(h)) << h;
}

TEST(Headers, ConfiguredAdditions)
{
    auto cfg = idem::config::builder().replay_header("X-Request-Signature").build();
    idem::header_allowlist allow(cfg);
    EXPECT_TRUE(allow.allows("x-request-signature"));
    EXPECT_TRUE(allow.allows("content-type"));
}

TEST(Headers, ToJsonKeepsAllowedLowercasesAndJoins)
{
    idem::header_allowlist allow;
    idem::header_list h = {{"Content-Type", "application/json"},
                           {"Set-Cookie", "sid=1"},
                           {"Authorization", "Bearer x"},
                           {"Cache-Control", "no-store"},
                           {"cache-control", "private"},
                           {"X-Other", "y"},
                           {"ETag", std::string("bad\0value", 9)}};
    auto j = nlohmann::json::parse(allow.to_json(h));
    EXPECT_EQ(j.size(), 2u);
    EXPECT_EQ(j["content-type"], "application/json");
    EXPECT_EQ(j["cache-control"], "no-store, private");
    EXPECT_FALSE(j.contains("set-cookie"));
    EXPECT_EQ(allow.to_json({}), "{}");
}

TEST(Headers, FromJsonRoundTrip)
{
    auto h = idem::headers_from_json(R"({"content-type":"text/plain","etag":"\"v1\""})");
    ASSERT_EQ(h.size(), 2u);
    idem::response r;
    r.headers = h;
    EXPECT_EQ(r.header_value("Content-Type").value_or(""), "text/plain");
    EXPECT_EQ(r.header_value("ETAG").value_or(""), "\"v1\"");
    EXPECT_TRUE(idem::headers_from_json("not json").empty());
    EXPECT_TRUE(idem::headers_from_json("[1,2]").empty());
}

TEST(Problems, RetryAfterRoundsUp)
{
    EXPECT_EQ(idem::retry_after_seconds(0ms), 1s);
    EXPECT_EQ(idem::retry_after_seconds(1ms), 1s);
    EXPECT_EQ(idem::retry_after_seconds(1000ms), 1s);
    EXPECT_EQ(idem::retry_after_seconds(1001ms), 2s);
}

namespace {
nlohmann::json body_of(const idem::response &r)
{
    EXPECT_EQ(r.header_value("content-type").value_or(""), "application/problem+json");
    auto j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["status"], r.status);
    EXPECT_TRUE(j.contains("type"));
    EXPECT_TRUE(j.contains("title"));
    return j;
}
}  // namespace

TEST(Problems, IetfProfile)
{
    using idem::status_profile;
    namespace p = idem::problems;
    const auto ietf = status_profile::ietf;
    EXPECT_EQ(p::missing_key(ietf).status, 400);
    EXPECT_EQ(p::invalid_key(ietf, idem::key_status::duplicated).status, 400);
    EXPECT_NE(body_of(p::invalid_key(ietf, idem::key_status::duplicated))["detail"]
                  .get<std::string>()
                  .find("more than one"),
              std::string::npos);
    EXPECT_EQ(p::key_reused(ietf).status, 422);
    auto busy = p::in_progress(ietf, 1500ms);
    EXPECT_EQ(busy.status, 409);
    EXPECT_EQ(busy.header_value("Retry-After").value_or(""), "2");
    EXPECT_EQ(body_of(busy)["type"], "urn:pg-idem:problem:request-in-progress");
    EXPECT_EQ(p::cooldown(ietf, 300ms).status, 503);
    EXPECT_EQ(p::cooldown(ietf, 300ms).header_value("retry-after").value_or(""), "1");
    EXPECT_EQ(p::not_replayable(ietf).status, 409);
    EXPECT_EQ(p::request_too_large(ietf, 10).status, 413);
    EXPECT_EQ(p::store_unavailable(ietf, 1s).status, 503);
    EXPECT_EQ(p::outcome_unknown(ietf, 1s).status, 503);
    for (auto r : {p::missing_key(ietf), p::key_reused(ietf), p::not_replayable(ietf)})
        body_of(r);
}

TEST(Problems, SeedProfile)
{
    namespace p = idem::problems;
    const auto seed = idem::status_profile::conflict409;
    EXPECT_EQ(p::key_reused(seed).status, 409);
    auto busy = p::in_progress(seed, 1s);
    EXPECT_EQ(busy.status, 503);
    EXPECT_EQ(busy.header_value("Retry-After").value_or(""), "1");
    EXPECT_EQ(p::missing_key(seed).status, 400);
    EXPECT_EQ(p::not_replayable(seed).status, 409);
}

TEST(Problems, CustomProblem)
{
    idem::problem pr;
    pr.status = 418;
    pr.title = "I'm a teapot";
    auto r = idem::make_problem_response(pr);
    auto j = body_of(r);
    EXPECT_EQ(j["type"], "about:blank");
    EXPECT_FALSE(j.contains("detail"));
    EXPECT_FALSE(r.header_value("Retry-After").has_value());
}

TEST(Metrics, Names)
{
    EXPECT_STREQ(idem::to_string(idem::outcome::won_completed), "won_completed");
    EXPECT_STREQ(idem::to_string(idem::outcome::completed_uncacheable), "completed_uncacheable");
    EXPECT_STREQ(idem::to_string(idem::event::recovered_abandoned), "recovered_abandoned");
    EXPECT_STREQ(idem::to_string(idem::event::release_error), "release_error");
}
