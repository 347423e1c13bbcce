// The sender's side: UUIDv7 keys, Retry-After parsing and the retry policy.
#include <idem/error.hpp>
#include <idem/retry_policy.hpp>

#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <thread>

namespace idem {

namespace {

using std::chrono::duration_cast;
using std::chrono::system_clock;

// Milliseconds since the Unix epoch, never less than a previous call's, so
// keys minted by one process sort in minting order across clock steps.
std::uint64_t monotonic_unix_ms()
{
    static std::atomic<std::uint64_t> last{0};
    const auto now = static_cast<std::uint64_t>(
        duration_cast<std::chrono::milliseconds>(system_clock::now().time_since_epoch()).count());
    std::uint64_t prev = last.load(std::memory_order_relaxed);
    for (;;)
    {
        const std::uint64_t ts = std::max(now, prev);
        if (last.compare_exchange_weak(prev, ts, std::memory_order_relaxed))
            return ts;
    }
}

// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm),
// so HTTP-dates need neither timegm() nor the TZ environment.
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
    const auto yoe = static_cast<unsigned>(y - era * 400);
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// The year of a day count from 1970-01-01, for the two-digit years of RFC 850 dates.
std::int64_t year_from_days(std::int64_t z)
{
    z += 719468;
    const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const auto doe = static_cast<unsigned>(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    const unsigned m = mp < 10 ? mp + 3 : mp - 9;
    return static_cast<std::int64_t>(yoe) + era * 400 + (m <= 2);
}

// Whether a day exists in a month, so "Feb 30" is refused rather than wrapped.
bool valid_day(std::int64_t y, unsigned m, unsigned d)
{
    static const unsigned length[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d >= 1 && d <= length[m - 1] + (m == 2 && leap ? 1u : 0u);
}

// A left-to-right reader of the fixed-format HTTP-date grammar.
class cursor
{
public:
    explicit cursor(std::string_view s) : s_(s) {}
    bool literal(std::string_view t)
    {
        if (s_.substr(i_, t.size()) != t)
            return false;
        i_ += t.size();
        return true;
    }
    // Exactly n ASCII digits.
    bool digits(unsigned n, unsigned &out)
    {
        if (s_.size() - i_ < n)
            return false;
        unsigned v = 0;
        for (unsigned k = 0; k < n; ++k)
        {
            const char c = s_[i_ + k];
            if (c < '0' || c > '9')
                return false;
            v = v * 10 + static_cast<unsigned>(c - '0');
        }
        i_ += n;
        out = v;
        return true;
    }
    // One of names (case-sensitive, as RFC 9110 spells them); its index.
    template <std::size_t N>
    bool one_of(const char *const (&names)[N], unsigned &out)
    {
        for (std::size_t k = 0; k < N; ++k)
            if (literal(names[k]))
            {
                out = static_cast<unsigned>(k);
                return true;
            }
        return false;
    }
    bool at_end() const { return i_ == s_.size(); }

private:
    std::string_view s_;
    std::size_t i_ = 0;
};

const char *const short_days[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
const char *const long_days[] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                 "Friday", "Saturday", "Sunday"};
const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// The broken-down time an HTTP-date names.
struct civil_time
{
    std::int64_t year = 0;
    unsigned month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

// time-of-day = hour ":" minute ":" second (a leap second 60 is allowed).
bool read_time(cursor &c, civil_time &t)
{
    return c.digits(2, t.hour) && c.literal(":") && c.digits(2, t.minute) && c.literal(":") &&
           c.digits(2, t.second) && t.hour <= 23 && t.minute <= 59 && t.second <= 60;
}

// IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT", after the day name.
bool read_imf_fixdate(cursor &c, civil_time &t)
{
    unsigned y = 0;
    if (!(c.literal(", ") && c.digits(2, t.day) && c.literal(" ") && c.one_of(months, t.month) &&
          c.literal(" ") && c.digits(4, y) && c.literal(" ") && read_time(c, t) &&
          c.literal(" GMT") && c.at_end()))
        return false;
    t.year = y;
    return true;
}

// RFC 850, "Sunday, 06-Nov-94 08:49:37 GMT", after the day name; the century
// is chosen as RFC 9110 says: not more than 50 years after now.
bool read_rfc850(cursor &c, civil_time &t, system_clock::time_point now)
{
    unsigned yy = 0;
    if (!(c.literal(", ") && c.digits(2, t.day) && c.literal("-") && c.one_of(months, t.month) &&
          c.literal("-") && c.digits(2, yy) && c.literal(" ") && read_time(c, t) &&
          c.literal(" GMT") && c.at_end()))
        return false;
    const std::int64_t this_year =
        year_from_days(duration_cast<std::chrono::seconds>(now.time_since_epoch()).count() / 86400);
    std::int64_t y = this_year - this_year % 100 + yy;
    if (y > this_year + 50)
        y -= 100;
    else if (y + 100 <= this_year + 50)
        y += 100;
    t.year = y;
    return true;
}

// asctime, "Sun Nov  6 08:49:37 1994", after the day name.
bool read_asctime(cursor &c, civil_time &t)
{
    unsigned y = 0;
    if (!(c.literal(" ") && c.one_of(months, t.month) && c.literal(" ")))
        return false;
    if (!(c.literal(" ") ? c.digits(1, t.day) : c.digits(2, t.day)))
        return false;
    if (!(c.literal(" ") && read_time(c, t) && c.literal(" ") && c.digits(4, y) && c.at_end()))
        return false;
    t.year = y;
    return true;
}

// An HTTP-date as seconds since the Unix epoch.
std::optional<std::int64_t> parse_http_date(std::string_view v, system_clock::time_point now)
{
    civil_time t;
    unsigned weekday = 0;
    bool ok = false;
    {
        cursor c(v);  // long names first: "Monday" also starts with "Mon"
        if (c.one_of(long_days, weekday))
            ok = read_rfc850(c, t, now);
    }
    if (!ok)
    {
        cursor c(v);
        if (c.one_of(short_days, weekday))
        {
            cursor again = c;
            ok = read_imf_fixdate(c, t) || read_asctime(again, t);
        }
    }
    if (!ok)
        return std::nullopt;
    ++t.month;  // one_of gave the index
    if (!valid_day(t.year, t.month, t.day))
        return std::nullopt;
    return days_from_civil(t.year, t.month, t.day) * 86400 + t.hour * 3600 + t.minute * 60 +
           t.second;
}

// Uniform in [0, 1) from a per-thread generator, so a shared policy needs no lock.
double default_random()
{
    thread_local std::mt19937_64 gen{std::random_device{}()};
    return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

std::string uuid_v7(std::uint64_t unix_ms, const std::array<std::uint8_t, 10> &random)
{
    std::uint8_t b[16];
    for (int k = 0; k < 6; ++k)
        b[k] = static_cast<std::uint8_t>(unix_ms >> (40 - 8 * k));
    std::copy(random.begin(), random.end(), b + 6);
    b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x70);  // version 7
    b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);  // variant 10
    static const char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(36);
    for (int k = 0; k < 16; ++k)
    {
        if (k == 4 || k == 6 || k == 8 || k == 10)
            out.push_back('-');
        out.push_back(hex[b[k] >> 4]);
        out.push_back(hex[b[k] & 0x0f]);
    }
    return out;
}

std::string uuid_v7()
{
    std::array<std::uint8_t, 10> random{};
    if (RAND_bytes(random.data(), static_cast<int>(random.size())) != 1)
        throw std::runtime_error("OpenSSL: RAND_bytes failed, no key minted");
    return uuid_v7(monotonic_unix_ms(), random);
}

namespace sender {

bool retryable_status(int status, bool has_retry_after) noexcept
{
    switch (status)
    {
        case 408:  // request timeout
        case 425:  // too early
        case 429:  // too many requests
        case 500:
        case 502:
        case 503:
        case 504:
            return true;
        case 409:  // in progress (with Retry-After) or a real conflict (without)
            return has_retry_after;
        default:
            return false;
    }
}

std::optional<milliseconds> parse_retry_after(std::string_view value, system_clock::time_point now)
{
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
        value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t'))
        value.remove_suffix(1);
    if (value.empty())
        return std::nullopt;
    if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
    {
        constexpr std::int64_t cap = std::int64_t(1) << 31;  // RFC 9111's delta-seconds ceiling
        std::int64_t s = 0;
        for (char c : value)
        {
            s = s * 10 + (c - '0');
            if (s >= cap)
            {
                s = cap;
                break;
            }
        }
        return milliseconds(s * 1000);
    }
    const auto at = parse_http_date(value, now);
    if (!at)
        return std::nullopt;
    const std::int64_t now_ms = duration_cast<milliseconds>(now.time_since_epoch()).count();
    return milliseconds(std::max<std::int64_t>(0, *at * 1000 - now_ms));
}

const char *to_string(verdict v) noexcept
{
    switch (v)
    {
        case verdict::retry:
            return "retry";
        case verdict::done:
            return "done";
        case verdict::attempts_exhausted:
            return "attempts_exhausted";
        case verdict::retry_after_too_long:
            return "retry_after_too_long";
    }
    return "unknown";
}

retry_policy::retry_policy(settings s)
    : s_(s),
      sleep_([](milliseconds d) { std::this_thread::sleep_for(d); }),
      clock_([] { return system_clock::now(); }),
      random_(default_random)
{
    if (s_.max_attempts < 1)
        throw config_error("retry_policy: max_attempts must be at least 1");
    if (s_.initial_backoff < milliseconds(0))
        throw config_error("retry_policy: initial_backoff must not be negative");
    if (s_.max_backoff < s_.initial_backoff)
        throw config_error("retry_policy: max_backoff must not be less than initial_backoff");
    if (!(s_.jitter >= 0.0 && s_.jitter <= 1.0))
        throw config_error("retry_policy: jitter must be between 0 and 1");
    if (s_.max_retry_after < milliseconds(0))
        throw config_error("retry_policy: max_retry_after must not be negative");
}

retry_policy &retry_policy::sleep_with(sleep_fn f)
{
    if (!f)
        throw config_error("retry_policy: sleep_with needs a function");
    sleep_ = std::move(f);
    return *this;
}

retry_policy &retry_policy::clock_with(clock_fn f)
{
    if (!f)
        throw config_error("retry_policy: clock_with needs a function");
    clock_ = std::move(f);
    return *this;
}

retry_policy &retry_policy::random_with(random_fn f)
{
    if (!f)
        throw config_error("retry_policy: random_with needs a function");
    random_ = std::move(f);
    return *this;
}

// initial_backoff * 2^(attempt-1), capped, without overflowing on long runs.
milliseconds retry_policy::backoff(unsigned attempt) const
{
    milliseconds b = s_.initial_backoff;
    for (unsigned k = 1; k < attempt && b < s_.max_backoff; ++k)
        b = b > s_.max_backoff / 2 ? s_.max_backoff : b * 2;
    return std::min(b, s_.max_backoff);
}

decision retry_policy::next(const attempt_result &r, unsigned attempt) const
{
    std::optional<milliseconds> wait;
    if (r.status && r.retry_after)
        wait = parse_retry_after(*r.retry_after, clock_());
    if (r.status && !retryable_status(*r.status, wait.has_value()))
        return {verdict::done, milliseconds(0)};
    if (attempt >= s_.max_attempts)
        return {verdict::attempts_exhausted, milliseconds(0)};
    if (wait && *wait > s_.max_retry_after)
        return {verdict::retry_after_too_long, milliseconds(0)};
    const double u = std::clamp(random_(), 0.0, 1.0);
    const milliseconds b = backoff(attempt);
    auto delay = milliseconds(
        static_cast<std::int64_t>(std::llround(static_cast<double>(b.count()) * (1.0 - s_.jitter * u))));
    if (wait && *wait > delay)
        delay = *wait;
    return {verdict::retry, delay};
}

result retry_policy::run(const attempt_fn &send) const
{
    return run(uuid_v7(), send);
}

result retry_policy::run(std::string key, const attempt_fn &send) const
{
    result out;
    out.key = std::move(key);
    for (unsigned attempt = 1;; ++attempt)
    {
        out.last = send(out.key, attempt);
        out.attempts = attempt;
        const decision d = next(out.last, attempt);
        if (d.what != verdict::retry)
        {
            out.why = d.what;
            return out;
        }
        sleep_(d.delay);
        out.waited += d.delay;
    }
}

}  // namespace sender
}  // namespace idem
