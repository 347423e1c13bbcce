// Validated runner configuration.
#include <idem/config.hpp>
#include <idem/http.hpp>

#include <algorithm>
#include <cctype>
#include <string>

namespace idem {

namespace {

std::string ms(milliseconds v) { return std::to_string(v.count()) + " ms"; }

[[noreturn]] void refuse(const std::string &what)
{
    throw config_error("idem::config: " + what);
}

void require_positive(const char *name, milliseconds v)
{
    if (v.count() <= 0)
        refuse(std::string(name) + " must be positive (got " + ms(v) + ")");
}

// An RFC 9110 field-name token.
bool is_token(const std::string &s)
{
    if (s.empty())
        return false;
    for (unsigned char c : s)
        if (!(std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) !=
                                     std::string_view::npos))
            return false;
    return true;
}

}  // namespace

config::config() = default;

config::builder::builder() = default;

config::builder &config::builder::lease(milliseconds v)
{
    c_.lease_ = v;
    return *this;
}
config::builder &config::builder::renew_interval(milliseconds v)
{
    c_.renew_interval_ = v;
    renew_set_ = true;
    return *this;
}
config::builder &config::builder::follower_wait_budget(milliseconds v)
{
    c_.wait_budget_ = v;
    return *this;
}
config::builder &config::builder::poll(milliseconds min, milliseconds max)
{
    c_.poll_min_ = min;
    c_.poll_max_ = max;
    return *this;
}
config::builder &config::builder::poll_jitter(double fraction)
{
    c_.poll_jitter_ = fraction;
    return *this;
}
config::builder &config::builder::retry_after(milliseconds v)
{
    c_.retry_after_ = v;
    return *this;
}
config::builder &config::builder::failure_cooldown(milliseconds v)
{
    c_.failure_cooldown_ = v;
    return *this;
}
config::builder &config::builder::max_request_body_bytes(std::size_t v)
{
    c_.max_request_ = v;
    return *this;
}
config::builder &config::builder::max_cacheable_response_bytes(std::size_t v)
{
    c_.max_response_ = v;
    return *this;
}
config::builder &config::builder::max_iterations(unsigned v)
{
    c_.max_iterations_ = v;
    return *this;
}
config::builder &config::builder::transaction_attempts(unsigned v)
{
    c_.tx_attempts_ = v;
    return *this;
}
config::builder &config::builder::profile(status_profile p)
{
    c_.profile_ = p;
    return *this;
}
config::builder &config::builder::prepared_statements(pg::preparation how)
{
    c_.preparation_ = how;
    return *this;
}
config::builder &config::builder::pooler_mode(bool on)
{
    c_.preparation_ = on ? pg::preparation::unnamed : pg::preparation::automatic;
    c_.wait_slice_ = on ? pooled_wait_slice : milliseconds(0);
    c_.wait_slice_set_ = on;
    return *this;
}
config::builder &config::builder::server_wait_slice(milliseconds v)
{
    c_.wait_slice_ = v;
    c_.wait_slice_set_ = true;
    return *this;
}
config::builder &config::builder::on_error(error_hook hook)
{
    c_.on_error_ = std::move(hook);
    return *this;
}
config::builder &config::builder::log_errors(bool on)
{
    c_.log_errors_ = on;
    return *this;
}
config::builder &config::builder::wakeup(follower_wakeup w)
{
    c_.wakeup_ = w;
    return *this;
}
config::builder &config::builder::client_errors(idem::client_errors how)
{
    c_.client_errors_ = how;
    return *this;
}
config::builder &config::builder::replay_header(std::string name)
{
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    c_.replay_headers_.push_back(std::move(name));
    return *this;
}
config::builder &config::builder::schema(std::string name)
{
    c_.schema_ = std::move(name);
    return *this;
}
config::builder &config::builder::key_namespace(std::string name)
{
    c_.key_namespace_ = std::move(name);
    return *this;
}

config config::builder::build() const
{
    config c = c_;
    if (!renew_set_)
        c.renew_interval_ = std::max(milliseconds(1), c.lease_ / protocol::defaults::renew_divisor);

    require_positive("lease", c.lease_);
    if (c.lease_ < protocol::limits::min_lease)
        refuse("lease must be at least " + ms(protocol::limits::min_lease) + " (got " + ms(c.lease_) + ")");
    if (c.lease_ > protocol::limits::max_lease)
        refuse("lease must be at most " +
               std::to_string(std::chrono::duration_cast<std::chrono::hours>(protocol::limits::max_lease).count()) +
               " hours (got " + ms(c.lease_) + ")");
    require_positive("renew_interval", c.renew_interval_);
    if (c.renew_interval_ >= c.lease_)
        refuse("renew_interval (" + ms(c.renew_interval_) + ") must be shorter than lease (" +
               ms(c.lease_) + ")");
    require_positive("follower_wait_budget", c.wait_budget_);
    require_positive("poll min", c.poll_min_);
    require_positive("poll max", c.poll_max_);
    if (c.poll_min_ > c.poll_max_)
        refuse("poll min (" + ms(c.poll_min_) + ") must not exceed poll max (" + ms(c.poll_max_) +
               ")");
    if (!(c.poll_jitter_ >= 0.0 && c.poll_jitter_ < 1.0))
        refuse("poll_jitter must be in [0, 1) (got " + std::to_string(c.poll_jitter_) + ")");
    if (c.wait_slice_.count() < 0)
        refuse("server_wait_slice must not be negative (got " + ms(c.wait_slice_) + ")");
    require_positive("retry_after", c.retry_after_);
    require_positive("failure_cooldown", c.failure_cooldown_);
    if (c.max_request_ == 0)
        refuse("max_request_body_bytes must be positive");
    if (c.max_response_ == 0)
        refuse("max_cacheable_response_bytes must be positive");
    if (c.max_iterations_ == 0)
        refuse("max_iterations must be positive");
    if (c.tx_attempts_ == 0)
        refuse("transaction_attempts must be at least 1");
    if (c.client_errors_ != idem::client_errors::release && c.client_errors_ != idem::client_errors::store)
        refuse("client_errors must be release or store (got " +
               std::to_string(static_cast<int>(c.client_errors_)) + ")");
    for (const std::string &h : c.replay_headers_)
    {
        if (!is_token(h))
            refuse("replay header \"" + h + "\" is not a valid header name");
        if (is_never_stored(h))
            refuse("replay header \"" + h +
                   "\" carries credentials or session state and is never stored");
    }
    if (c.schema_.find('\0') != std::string::npos)
        refuse("schema contains a NUL byte");
    for (unsigned char ch : c.key_namespace_)
        if (std::isspace(ch) || ch == '\0')
            refuse("key_namespace is a service name without spaces (got \"" + c.key_namespace_ + "\")");
    return c;
}

}  // namespace idem
