// SingleFlight configuration: defaults and refusal of bad values.
#include <idem/config.hpp>

#include <gtest/gtest.h>

#include <string>

using namespace std::chrono_literals;
using idem::config;

namespace {

// The message of the config_error build() throws, or "" when it builds.
std::string refusal(const config::builder &b)
{
    try
    {
        b.build();
    }
    catch (const idem::config_error &e)
    {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Config, DefaultsAreTheSeeds)
{
    config c;
    EXPECT_EQ(c.lease(), 30s);
    EXPECT_EQ(c.renew_interval(), 10s);
    EXPECT_EQ(c.follower_wait_budget(), 5s);
    EXPECT_EQ(c.poll_min(), 50ms);
    EXPECT_EQ(c.poll_max(), 1s);
    EXPECT_DOUBLE_EQ(c.poll_jitter(), 0.25);
    EXPECT_EQ(c.retry_after(), 1s);
    EXPECT_EQ(c.failure_cooldown(), 2s);
    EXPECT_EQ(c.max_cacheable_response_bytes(), 2u * 1024 * 1024);
    EXPECT_EQ(c.profile(), idem::status_profile::ietf);
    EXPECT_EQ(c.wakeup(), idem::follower_wakeup::server_wait);
    EXPECT_EQ(c.client_errors(), idem::client_errors::release);  // as Python's and Node's
    EXPECT_NO_THROW(config::builder().build());
}

TEST(Config, ClientErrorsReleaseOrStore)
{
    EXPECT_EQ(config::builder().build().client_errors(), idem::client_errors::release);
    EXPECT_EQ(config::builder().client_errors(idem::client_errors::store).build().client_errors(),
              idem::client_errors::store);
    EXPECT_EQ(refusal(config::builder().client_errors(static_cast<idem::client_errors>(7))),
              "idem::config: client_errors must be release or store (got 7)");
}

TEST(Config, RenewDefaultsToAThirdOfTheLease)
{
    EXPECT_EQ(config::builder().lease(300ms).build().renew_interval(), 100ms);
    EXPECT_EQ(config::builder().lease(3s).renew_interval(2s).build().renew_interval(), 2s);
}

TEST(Config, RefusesZeroNegativeAndInverted)
{
    EXPECT_NE(refusal(config::builder().lease(0ms)).find("lease must be positive"), std::string::npos);
    EXPECT_NE(refusal(config::builder().lease(-5ms)).find("lease"), std::string::npos);
    EXPECT_NE(refusal(config::builder().lease(5ms)).find("at least 10 ms"), std::string::npos);
    EXPECT_NE(refusal(config::builder().lease(25h)).find("at most 24 hours"), std::string::npos);
    EXPECT_NE(refusal(config::builder().lease(1s).renew_interval(1s)).find("must be shorter than lease"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().lease(1s).renew_interval(2s)).find("renew_interval (2000 ms)"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().renew_interval(0ms)).find("renew_interval must be positive"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().follower_wait_budget(0ms)).find("follower_wait_budget"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().poll(0ms, 1s)).find("poll min must be positive"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().poll(2s, 1s)).find("must not exceed poll max"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().poll_jitter(1.0)).find("poll_jitter"), std::string::npos);
    EXPECT_NE(refusal(config::builder().poll_jitter(-0.1)).find("poll_jitter"), std::string::npos);
    EXPECT_NE(refusal(config::builder().retry_after(0ms)).find("retry_after"), std::string::npos);
    EXPECT_NE(refusal(config::builder().failure_cooldown(-1ms)).find("failure_cooldown"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().max_request_body_bytes(0)).find("max_request_body_bytes"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().max_cacheable_response_bytes(0)).find("max_cacheable"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().max_iterations(0)).find("max_iterations"), std::string::npos);
    EXPECT_NE(refusal(config::builder().transaction_attempts(0)).find("transaction_attempts"),
              std::string::npos);
}

TEST(Config, EveryMessageNamesTheClass)
{
    EXPECT_EQ(refusal(config::builder().lease(0ms)).rfind("idem::config: ", 0), 0u);
}

TEST(Config, ReplayHeadersRefuseSessionState)
{
    EXPECT_NE(refusal(config::builder().replay_header("Set-Cookie")).find("never stored"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().replay_header("authorization")).find("never stored"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().replay_header("X-Session-Id")).find("never stored"),
              std::string::npos);
    EXPECT_NE(refusal(config::builder().replay_header("bad header")).find("not a valid header name"),
              std::string::npos);
    auto c = config::builder().replay_header("X-Request-Signature").build();
    ASSERT_EQ(c.replay_headers().size(), 1u);
    EXPECT_EQ(c.replay_headers()[0], "x-request-signature");
}

TEST(Config, SettersReachTheConfig)
{
    auto c = config::builder()
                 .lease(2s)
                 .renew_interval(500ms)
                 .follower_wait_budget(3s)
                 .poll(10ms, 200ms)
                 .poll_jitter(0.1)
                 .retry_after(2s)
                 .failure_cooldown(3s)
                 .max_request_body_bytes(10)
                 .max_cacheable_response_bytes(20)
                 .max_iterations(7)
                 .transaction_attempts(2)
                 .profile(idem::status_profile::conflict409)
                 .wakeup(idem::follower_wakeup::polling)
                 .schema("idem")
                 .build();
    EXPECT_EQ(c.lease(), 2s);
    EXPECT_EQ(c.renew_interval(), 500ms);
    EXPECT_EQ(c.follower_wait_budget(), 3s);
    EXPECT_EQ(c.poll_min(), 10ms);
    EXPECT_EQ(c.poll_max(), 200ms);
    EXPECT_DOUBLE_EQ(c.poll_jitter(), 0.1);
    EXPECT_EQ(c.retry_after(), 2s);
    EXPECT_EQ(c.failure_cooldown(), 3s);
    EXPECT_EQ(c.max_request_body_bytes(), 10u);
    EXPECT_EQ(c.max_cacheable_response_bytes(), 20u);
    EXPECT_EQ(c.max_iterations(), 7u);
    EXPECT_EQ(c.transaction_attempts(), 2u);
    EXPECT_EQ(c.profile(), idem::status_profile::conflict409);
    EXPECT_EQ(c.wakeup(), idem::follower_wakeup::polling);
    EXPECT_EQ(c.schema(), "idem");
}
