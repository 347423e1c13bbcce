// The sender-side retry policy: UUIDv7 keys, Retry-After parsing, which
// answers are retried, key reuse, the attempt bound and the backoff.
#include <idem/error.hpp>
#include <idem/key.hpp>
#include <idem/retry_policy.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idem::sender::attempt_result;
using idem::sender::parse_retry_after;
using idem::sender::retry_policy;
using idem::sender::retryable_status;
using idem::sender::settings;
using idem::sender::verdict;
using std::chrono::milliseconds;
using std::chrono::system_clock;

// The 48-bit timestamp of a UUIDv7 text.
std::uint64_t timestamp_of(const std::string &uuid)
{
    return std::stoull(uuid.substr(0, 8) + uuid.substr(9, 4), nullptr, 16);
}

// Milliseconds since the epoch now.
std::uint64_t now_ms()
{
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
}

// 1994-11-06 08:49:37 UTC, the date of RFC 9110's examples, minus `before`.
system_clock::time_point rfc_date_minus(std::chrono::seconds before)
{
    return system_clock::time_point(std::chrono::seconds(784111777) - before);
}

// A policy whose sleeps are recorded, whose jitter draw is fixed and whose
// clock is a fixed instant.
struct recorded
{
    std::vector<milliseconds> sleeps;
    double draw = 0.0;
    retry_policy policy;

    explicit recorded(settings s = settings()) : policy(s)
    {
        policy.sleep_with([this](milliseconds d) { sleeps.push_back(d); })
            .random_with([this] { return draw; })
            .clock_with([] { return rfc_date_minus(10s); });
    }
};

TEST(UuidV7, MatchesTheRfc9562Example)
{
    // RFC 9562, appendix A.6: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F.
    EXPECT_EQ(idem::uuid_v7(0x017F22E279B0,
                            {0x0c, 0xc3, 0x18, 0xc4, 0xdc, 0x0c, 0x0c, 0x07, 0x39, 0x8f}),
              "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    // Version and variant bits are forced whatever the random bytes are.
    EXPECT_EQ(idem::uuid_v7(0, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
              "00000000-0000-7fff-bfff-ffffffffffff");
}

TEST(UuidV7, HasTheVersionVariantAndLength)
{
    const std::regex form("^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
    for (int i = 0; i < 200; ++i)
    {
        const std::string k = idem::uuid_v7();
        ASSERT_TRUE(std::regex_match(k, form)) << k;
        // A key the runner and the server accept as it is.
        ASSERT_EQ(idem::check_key_header({k}), idem::key_status::ok);
    }
}

TEST(UuidV7, TimestampIsNowAndNeverGoesBack)
{
    const std::uint64_t before = now_ms();
    std::set<std::string> seen;
    std::uint64_t prev = 0;
    for (int i = 0; i < 2000; ++i)
    {
        const std::string k = idem::uuid_v7();
        const std::uint64_t ts = timestamp_of(k);
        ASSERT_GE(ts, prev) << "timestamp went back at key " << i;
        prev = ts;
        seen.insert(k);
    }
    const std::uint64_t after = now_ms();
    EXPECT_GE(timestamp_of(*seen.begin()), before);
    EXPECT_LE(prev, after);
    EXPECT_EQ(seen.size(), 2000u) << "74 random bits: no collisions expected";
}

TEST(RetryAfter, DeltaSeconds)
{
    EXPECT_EQ(parse_retry_after("120"), milliseconds(120000));
    EXPECT_EQ(parse_retry_after("0"), milliseconds(0));
    EXPECT_EQ(parse_retry_after(" 1\t"), milliseconds(1000));
    EXPECT_EQ(parse_retry_after("007"), milliseconds(7000));
    // Absurdly large values saturate instead of overflowing.
    EXPECT_EQ(parse_retry_after("99999999999999999999999999"),
              milliseconds((std::int64_t(1) << 31) * 1000));
    for (const char *bad : {"", " ", "-1", "+1", "1.5", "1s", "0x10", "one", "1 2"})
        EXPECT_FALSE(parse_retry_after(bad).has_value()) << "'" << bad << "'";
}

TEST(RetryAfter, HttpDateInTheThreeForms)
{
    const auto now = rfc_date_minus(90s);
    EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), milliseconds(90000));
    EXPECT_EQ(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now), milliseconds(90000));
    EXPECT_EQ(parse_retry_after("Sun Nov  6 08:49:37 1994", now), milliseconds(90000));
    EXPECT_EQ(parse_retry_after("Sun Nov 16 08:49:37 1994", now),
              milliseconds((10 * 86400 + 90) * 1000));
    // Sub-second "now": the wait is to the date, to the millisecond.
    EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now + 250ms), milliseconds(89750));
    // A date in the past means: retry now.
    EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", rfc_date_minus(-5s)),
              milliseconds(0));
    // Leap years and a leap second are dates; Feb 29 of 1900 is not.
    EXPECT_TRUE(parse_retry_after("Tue, 29 Feb 2000 00:00:00 GMT", now).has_value());
    EXPECT_TRUE(parse_retry_after("Sat, 31 Dec 2016 23:59:60 GMT", now).has_value());
    EXPECT_FALSE(parse_retry_after("Thu, 29 Feb 1900 00:00:00 GMT", now).has_value());
}

TEST(RetryAfter, RejectsMalformedDates)
{
    for (const char *bad : {
             "Sun, 06 Nov 1994 08:49:37 UTC",   // only GMT
             "Sun, 6 Nov 1994 08:49:37 GMT",    // two-digit day
             "sun, 06 Nov 1994 08:49:37 GMT",   // case-sensitive names
             "Sun, 06 nov 1994 08:49:37 GMT",
             "Sun, 06 Foo 1994 08:49:37 GMT",
             "Sun, 31 Nov 1994 08:49:37 GMT",   // no such day
             "Sun, 06 Nov 1994 24:00:00 GMT",
             "Sun, 06 Nov 1994 08:60:00 GMT",
             "Sun, 06 Nov 1994 08:49:37 GMT x",
             "Sun, 06 Nov 94 08:49:37 GMT",
             "Sunday, 06-Nov-1994 08:49:37 GMT",
             "Sun Nov 6 08:49:37 1994",          // asctime pads with a space
             "Sun Nov  6 08:49:37 1994 GMT",
             "Funday, 06-Nov-94 08:49:37 GMT",
         })
        EXPECT_FALSE(parse_retry_after(bad, rfc_date_minus(0s)).has_value()) << bad;
}

TEST(RetryAfter, Rfc850TwoDigitYearIsAtMostFiftyYearsAhead)
{
    // Seen in 2030: "30" is this year, "79" is 2079 (49 years on), "81" is
    // 1981 (51 years on would be too far).
    const auto in_2030 = system_clock::time_point(std::chrono::seconds(1893456000));  // 2030-01-01
    EXPECT_TRUE(parse_retry_after("Tuesday, 01-Jan-30 00:00:10 GMT", in_2030) == milliseconds(10000));
    EXPECT_GT(*parse_retry_after("Sunday, 01-Jan-79 00:00:00 GMT", in_2030), milliseconds(0));
    EXPECT_EQ(parse_retry_after("Thursday, 01-Jan-81 00:00:00 GMT", in_2030), milliseconds(0));
}

TEST(RetryableStatus, OnlyTransientAnswers)
{
    const std::set<int> retried = {408, 425, 429, 500, 502, 503, 504};
    for (int s = 100; s < 600; ++s)
    {
        EXPECT_EQ(retryable_status(s, false), retried.count(s) == 1) << s;
        EXPECT_EQ(retryable_status(s, true), retried.count(s) == 1 || s == 409) << s;
    }
}

TEST(RetryPolicy, MintsOneKeyPerOperationAndReusesItOnEveryRetry)
{
    recorded r;
    std::vector<std::string> keys;
    std::vector<unsigned> attempts;
    const int answers[] = {0, 503, 409, 201};  // 0: transport error
    auto send = [&](const std::string &key, unsigned attempt) {
        keys.push_back(key);
        attempts.push_back(attempt);
        const int s = answers[attempt - 1];
        if (s == 0)
            return attempt_result::transport_error();
        return attempt_result::response(s, s == 409 ? std::optional<std::string>("1") : std::nullopt);
    };
    const auto res = r.policy.run(send);
    EXPECT_EQ(res.why, verdict::done);
    EXPECT_EQ(res.attempts, 4u);
    EXPECT_EQ(res.last.status, 201);
    ASSERT_EQ(keys.size(), 4u);
    EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), 1u);
    EXPECT_EQ(keys[0], res.key);
    EXPECT_EQ(idem::check_key_header({res.key}), idem::key_status::ok);
    EXPECT_EQ(attempts, (std::vector<unsigned>{1, 2, 3, 4}));

    // The next operation gets a key of its own.
    keys.clear();
    const auto again = r.policy.run(send);
    EXPECT_NE(again.key, res.key);
    EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), std::set<std::string>{again.key});

    // A caller's own key is used as given.
    keys.clear();
    EXPECT_EQ(r.policy.run("order-42", send).key, "order-42");
    EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), std::set<std::string>{"order-42"});
}

TEST(RetryPolicy, StopsAfterMaxAttempts)
{
    settings s;
    s.max_attempts = 4;
    recorded r(s);
    unsigned calls = 0;
    const auto res = r.policy.run([&](const std::string &, unsigned) {
        ++calls;
        return attempt_result::response(503);
    });
    EXPECT_EQ(calls, 4u);
    EXPECT_EQ(res.attempts, 4u);
    EXPECT_EQ(res.why, verdict::attempts_exhausted);
    EXPECT_EQ(res.last.status, 503);
    EXPECT_EQ(r.sleeps.size(), 3u);

    s.max_attempts = 1;
    recorded once(s);
    EXPECT_EQ(once.policy.run([](const std::string &, unsigned) {
                  return attempt_result::transport_error();
              }).attempts,
              1u);
    EXPECT_TRUE(once.sleeps.empty());
}

TEST(RetryPolicy, FinalAnswersAreNotRetried)
{
    for (int s : {200, 201, 204, 400, 401, 404, 409, 413, 422})
    {
        recorded r;
        unsigned calls = 0;
        const auto res = r.policy.run([&](const std::string &, unsigned) {
            ++calls;
            return attempt_result::response(s);
        });
        EXPECT_EQ(calls, 1u) << s;
        EXPECT_EQ(res.why, verdict::done) << s;
        EXPECT_TRUE(r.sleeps.empty()) << s;
    }
    // A 409 whose Retry-After does not parse is a conflict, not "in progress".
    recorded r;
    EXPECT_EQ(r.policy.next(attempt_result::response(409, "soon"), 1).what, verdict::done);
}

TEST(RetryPolicy, ExponentialBackoffWithJitter)
{
    settings s;
    s.max_attempts = 8;
    s.initial_backoff = 100ms;
    s.max_backoff = 1000ms;
    s.jitter = 0.5;
    recorded r(s);
    auto always_503 = [](const std::string &, unsigned) { return attempt_result::response(503); };

    r.draw = 0.0;  // no jitter taken off
    r.policy.run(always_503);
    EXPECT_EQ(r.sleeps, (std::vector<milliseconds>{100ms, 200ms, 400ms, 800ms, 1000ms, 1000ms, 1000ms}));
    EXPECT_EQ(r.policy.run(always_503).waited, 4500ms);

    r.sleeps.clear();
    r.draw = 0.999999;  // nearly the whole jitter fraction taken off
    r.policy.run(always_503);
    EXPECT_EQ(r.sleeps, (std::vector<milliseconds>{50ms, 100ms, 200ms, 400ms, 500ms, 500ms, 500ms}));

    // With the real random source every pause stays within [b/2, b].
    retry_policy real(s);
    std::vector<milliseconds> pauses;
    real.sleep_with([&](milliseconds d) { pauses.push_back(d); });
    real.run(always_503);
    const long long cap[] = {100, 200, 400, 800, 1000, 1000, 1000};
    ASSERT_EQ(pauses.size(), 7u);
    for (std::size_t i = 0; i < pauses.size(); ++i)
    {
        EXPECT_GE(pauses[i].count(), cap[i] / 2) << i;
        EXPECT_LE(pauses[i].count(), cap[i]) << i;
    }
}

TEST(RetryPolicy, HonoursRetryAfterAsALowerBound)
{
    recorded r;
    // 409 in progress with delta-seconds: wait what the server asked.
    auto d = r.policy.next(attempt_result::response(409, "2"), 1);
    EXPECT_EQ(d.what, verdict::retry);
    EXPECT_EQ(d.delay, 2000ms);
    // An HTTP-date, read against the policy's clock (10 s before the date).
    d = r.policy.next(attempt_result::response(503, "Sun, 06 Nov 1994 08:49:37 GMT"), 1);
    EXPECT_EQ(d.delay, 10000ms);
    // A Retry-After shorter than the backoff does not shorten it.
    settings s;
    s.initial_backoff = 3000ms;
    recorded slow(s);
    EXPECT_EQ(slow.policy.next(attempt_result::response(429, "1"), 1).delay, 3000ms);
    // A malformed Retry-After on a 503: plain backoff.
    EXPECT_EQ(r.policy.next(attempt_result::response(503, "later"), 1).delay, 100ms);
}

TEST(RetryPolicy, GivesUpOnARetryAfterOverTheCap)
{
    settings s;
    s.max_retry_after = 30s;
    recorded r(s);
    unsigned calls = 0;
    const auto res = r.policy.run([&](const std::string &, unsigned) {
        ++calls;
        return attempt_result::response(503, "3600");
    });
    EXPECT_EQ(calls, 1u);
    EXPECT_EQ(res.why, verdict::retry_after_too_long);
    EXPECT_TRUE(r.sleeps.empty());
    EXPECT_EQ(r.policy.next(attempt_result::response(503, "30"), 1).delay, 30000ms);
}

TEST(RetryPolicy, RefusesBadSettings)
{
    auto make = [](auto change) {
        settings s;
        change(s);
        return retry_policy(s);
    };
    EXPECT_THROW(make([](settings &s) { s.max_attempts = 0; }), idem::config_error);
    EXPECT_THROW(make([](settings &s) { s.initial_backoff = -1ms; }), idem::config_error);
    EXPECT_THROW(make([](settings &s) { s.max_backoff = s.initial_backoff - 1ms; }), idem::config_error);
    EXPECT_THROW(make([](settings &s) { s.jitter = 1.5; }), idem::config_error);
    EXPECT_THROW(make([](settings &s) { s.jitter = -0.1; }), idem::config_error);
    EXPECT_THROW(make([](settings &s) { s.max_retry_after = -1ms; }), idem::config_error);
    EXPECT_NO_THROW(make([](settings &s) { s.jitter = 0; s.initial_backoff = 0ms; }));
    retry_policy p;
    EXPECT_THROW(p.sleep_with(nullptr), idem::config_error);
}

}  // namespace
