// Status matrix, replay header allowlist and problem details.
#include <idem/http.hpp>
#include <idem/metrics.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

namespace idem {

namespace {

std::string lower(std::string_view s)
{
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

const char *const default_replay_headers[] = {
    "content-type", "content-disposition", "content-language",
    "cache-control", "etag", "location",
};

// Exact names that carry credentials or session state.
const char *const never_stored_names[] = {
    "set-cookie", "set-cookie2", "cookie", "authorization", "proxy-authorization",
    "www-authenticate", "proxy-authenticate", "x-api-key", "x-csrf-token", "x-xsrf-token",
};
// Substrings that mark a header as session or auth state.
const char *const never_stored_parts[] = {"cookie", "session", "token", "authoriz", "authenticat"};

constexpr const char *problem_base = "urn:pg-idem:problem:";

}  // namespace

std::optional<std::string> response::header_value(std::string_view name) const
{
    for (const header &h : headers)
        if (header_name_equal(h.name, name))
            return h.value;
    return std::nullopt;
}

storage_action classify(int status) noexcept
{
    if (status >= 200 && status <= 299)
        return storage_action::finalize;
    switch (status)
    {
    case 400:
    case 404:
    case 409:
    case 422:
        return storage_action::finalize;
    case 408:
    case 429:
        return storage_action::fail;
    default:
        break;
    }
    if (status >= 500 && status <= 599)
        return storage_action::fail;
    if (status >= 100 && status <= 499)
        return storage_action::release;  // 1xx, 3xx, 401, 403 and other 4xx
    return storage_action::fail;         // not an HTTP status: treat as a server error
}

bool header_name_equal(std::string_view a, std::string_view b) noexcept
{
    if (a.size() != b.size())
        return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

bool is_never_stored(std::string_view name) noexcept
{
    for (const char *n : never_stored_names)
        if (header_name_equal(name, n))
            return true;
    std::string l;
    try
    {
        l = lower(name);
    }
    catch (...)
    {
        return true;
    }
    for (const char *part : never_stored_parts)
        if (l.find(part) != std::string::npos)
            return true;
    return false;
}

header_allowlist::header_allowlist()
{
    for (const char *n : default_replay_headers)
        names_.emplace_back(n);
}

header_allowlist::header_allowlist(const config &cfg) : header_allowlist()
{
    for (const std::string &n : cfg.replay_headers())
        if (!is_never_stored(n) && !allows(n))
            names_.push_back(lower(n));
}

bool header_allowlist::allows(std::string_view name) const noexcept
{
    if (is_never_stored(name))
        return false;
    for (const std::string &n : names_)
        if (header_name_equal(n, name))
            return true;
    return false;
}

std::string header_allowlist::to_json(const header_list &headers) const
{
    nlohmann::json obj = nlohmann::json::object();
    for (const header &h : headers)
    {
        // jsonb cannot hold U+0000, and such a value is not valid HTTP anyway.
        if (!allows(h.name) || h.value.find('\0') != std::string::npos)
            continue;
        const std::string name = lower(h.name);
        auto it = obj.find(name);
        if (it == obj.end())
            obj[name] = h.value;
        else
            *it = it->get<std::string>() + ", " + h.value;
    }
    return obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

header_list headers_from_json(std::string_view text)
{
    header_list out;
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
    if (!j.is_object())
        return out;
    for (auto it = j.begin(); it != j.end(); ++it)
    {
        if (it.value().is_string())
            out.push_back(header{it.key(), it.value().get<std::string>()});
        else if (!it.value().is_null())
            out.push_back(header{it.key(), it.value().dump()});
    }
    return out;
}

std::chrono::seconds retry_after_seconds(std::chrono::milliseconds d) noexcept
{
    auto s = (d.count() + 999) / 1000;
    return std::chrono::seconds(s < 1 ? 1 : s);
}

response make_problem_response(const problem &p)
{
    nlohmann::json body = {
        {"type", p.type.empty() ? std::string("about:blank") : p.type},
        {"title", p.title},
        {"status", p.status},
    };
    if (!p.detail.empty())
        body["detail"] = p.detail;
    response r;
    r.status = p.status;
    r.headers.push_back({"Content-Type", "application/problem+json"});
    if (p.retry_after)
        r.headers.push_back({"Retry-After", std::to_string(p.retry_after->count())});
    r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return r;
}

namespace problems {

namespace {
response make(int status, const char *slug, const char *title, std::string detail,
              std::optional<std::chrono::milliseconds> retry = std::nullopt)
{
    problem p;
    p.status = status;
    p.type = std::string(problem_base) + slug;
    p.title = title;
    p.detail = std::move(detail);
    if (retry)
        p.retry_after = retry_after_seconds(*retry);
    return make_problem_response(p);
}
}  // namespace

response missing_key(status_profile)
{
    return make(400, "idempotency-key-missing", "Idempotency-Key header is missing",
                describe(key_status::absent));
}

response invalid_key(status_profile, key_status why)
{
    return make(400, "idempotency-key-invalid", "Idempotency-Key header is invalid",
                describe(why));
}

response key_reused(status_profile p)
{
    return make(p == status_profile::ietf ? 422 : 409, "idempotency-key-reused",
                "Idempotency-Key is already used for a different request",
                "This key was used with another request body. Use a new key for a new request.");
}

response in_progress(status_profile p, std::chrono::milliseconds retry_after)
{
    return make(p == status_profile::ietf ? 409 : 503, "request-in-progress",
                "A request with this Idempotency-Key is being processed",
                "Retry after the delay in Retry-After to get its response.", retry_after);
}

response cooldown(status_profile, std::chrono::milliseconds retry_after)
{
    return make(503, "request-failed-recently",
                "The last attempt with this Idempotency-Key failed",
                "Retry after the delay in Retry-After.", retry_after);
}

response not_replayable(status_profile)
{
    return make(409, "response-not-replayable",
                "The request was completed but its response cannot be replayed",
                "The response was too large to store. Use a new key to repeat the request.");
}

// The key's response is past idem.ttl and the server refuses to run the
// request again (idem.after_ttl = 'refuse'): 410 Gone in the IETF profile
// (the resource the key named is gone for good), 409 in the seed profile,
// which answers every "this key cannot be used for this" with 409.
response expired(status_profile p)
{
    return make(p == status_profile::ietf ? 410 : 409, "idempotency-key-expired",
                "The Idempotency-Key has expired",
                "The request with this key finished too long ago for its response to be kept. "
                "Use a new key to repeat the request.");
}

response request_too_large(status_profile, std::size_t limit)
{
    return make(413, "request-too-large", "Request body too large",
                "The request body is over " + std::to_string(limit) + " bytes.");
}

response store_unavailable(status_profile, std::chrono::milliseconds retry_after)
{
    return make(503, "idempotency-store-unavailable", "Idempotency store unavailable",
                "The request was not run. Retry after the delay in Retry-After.", retry_after);
}

response outcome_unknown(status_profile, std::chrono::milliseconds retry_after)
{
    return make(503, "outcome-unknown", "The outcome of this request is not known yet",
                "Retry with the same Idempotency-Key: the request will not be run twice.",
                retry_after);
}

}  // namespace problems

const char *to_string(outcome o) noexcept
{
    switch (o)
    {
    case outcome::won_completed:
        return "won_completed";
    case outcome::replay:
        return "replay";
    case outcome::conflict:
        return "conflict";
    case outcome::timeout:
        return "timeout";
    case outcome::failed:
        return "failed";
    case outcome::completed_uncacheable:
        return "completed_uncacheable";
    case outcome::unguarded:
        return "unguarded";
    case outcome::rejected:
        return "rejected";
    case outcome::expired:
        return "expired";
    }
    return "unknown";
}

const char *to_string(event e) noexcept
{
    switch (e)
    {
    case event::claimed:
        return "claimed";
    case event::recovered_ttl:
        return "recovered_ttl";
    case event::recovered_abandoned:
        return "recovered_abandoned";
    case event::pending_wait:
        return "pending_wait";
    case event::retryable_cooldown:
        return "retryable_cooldown";
    case event::lease_stolen:
        return "lease_stolen";
    case event::finalize_error:
        return "finalize_error";
    case event::release_error:
        return "release_error";
    case event::unknown_outcome:
        return "unknown_outcome";
    case event::finalized:
        return "finalized";
    }
    return "unknown";
}

}  // namespace idem
