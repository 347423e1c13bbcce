// Status matrix, replay header allowlist and problem details. The replay
// headers, like the statuses, are the protocol's (idem/protocol.hpp).
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

}  // namespace

std::optional<std::string> response::header_value(std::string_view name) const
{
    for (const header &h : headers)
        if (header_name_equal(h.name, name))
            return h.value;
    return std::nullopt;
}

storage_action classify(int status) noexcept { return protocol::classify(status); }

storage_action classify(int status, client_errors how) noexcept
{
    const storage_action action = protocol::classify(status);
    if (action == storage_action::finalize && how == client_errors::release &&
        protocol::is_validation_status(status))
        return storage_action::release;
    return action;
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
    for (std::string_view n : protocol::never_stored_headers)
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
    for (std::string_view part : protocol::never_stored_header_parts)
        if (l.find(part) != std::string::npos)
            return true;
    return false;
}

header_allowlist::header_allowlist()
{
    for (std::string_view n : protocol::default_replay_headers)
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

response make(protocol::problem which, status_profile profile,
              std::optional<std::chrono::milliseconds> retry_after, std::string detail)
{
    const protocol::problem_info &info = protocol::info(which);
    problem p;
    p.status = protocol::status(which, profile);
    p.type = std::string(protocol::problem_base) + std::string(info.slug);
    p.title = std::string(info.title);
    p.detail = detail.empty() ? std::string(info.detail) : std::move(detail);
    if (info.retry_after && retry_after)
        p.retry_after = retry_after_seconds(*retry_after);
    return make_problem_response(p);
}

std::optional<response> for_outcome(protocol::server_outcome o, status_profile p,
                                    std::chrono::milliseconds retry_after)
{
    if (o == protocol::server_outcome::unknown)
        return std::nullopt;
    const protocol::outcome_info &info = protocol::info(o);
    if (!info.has_problem ||
        (info.what != protocol::action::answer && info.what != protocol::action::wait))
        return std::nullopt;
    return make(info.answer, p, retry_after);
}

response missing_key(status_profile p)
{
    return make(protocol::problem::missing_key, p, std::nullopt, describe(key_status::absent));
}

response invalid_key(status_profile p, key_status why)
{
    return make(protocol::problem::invalid_key, p, std::nullopt, describe(why));
}

response key_reused(status_profile p) { return make(protocol::problem::key_reused, p); }

response in_progress(status_profile p, std::chrono::milliseconds retry_after)
{
    return make(protocol::problem::in_progress, p, retry_after);
}

response cooldown(status_profile p, std::chrono::milliseconds retry_after)
{
    return make(protocol::problem::cooldown, p, retry_after);
}

response not_replayable(status_profile p) { return make(protocol::problem::not_replayable, p); }

response expired(status_profile p) { return make(protocol::problem::expired, p); }

response request_too_large(status_profile p, std::size_t limit)
{
    std::string detail(protocol::info(protocol::problem::request_too_large).detail);
    const std::string mark = "{limit}";
    const std::size_t at = detail.find(mark);
    if (at != std::string::npos)
        detail.replace(at, mark.size(), std::to_string(limit));
    return make(protocol::problem::request_too_large, p, std::nullopt, detail);
}

response store_unavailable(status_profile p, std::chrono::milliseconds retry_after)
{
    return make(protocol::problem::store_unavailable, p, retry_after);
}

response outcome_unknown(status_profile p, std::chrono::milliseconds retry_after)
{
    return make(protocol::problem::outcome_unknown, p, retry_after);
}

}  // namespace problems

const char *to_string(outcome o) noexcept
{
    // The generated names are string literals: data() is NUL-terminated.
    return protocol::name(o).data();
}

const char *to_string(event e) noexcept
{
    // The generated names are string literals: data() is NUL-terminated.
    return protocol::name(e).data();
}

}  // namespace idem
