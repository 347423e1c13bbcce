// pg_idem C++ client: the HTTP side: request view, response, status
// matrix, replay header allowlist and RFC 9457 problem details.
#pragma once

#include <idem/config.hpp>
#include <idem/key.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

struct header
{
    std::string name;
    std::string value;
};
using header_list = std::vector<header>;

// What the runner needs of an incoming request. The views must outlive the
// run() call.
struct request_view
{
    std::string_view principal;  // the authenticated (effective) actor
    std::string_view method;     // as routed, e.g. "POST"
    std::string_view target;     // path and query
    // Every Idempotency-Key header field value as received: zero, one or several.
    std::vector<std::string_view> idempotency_keys;
    std::string_view body;
    // The route refuses requests without a key (400) instead of running them
    // unguarded.
    bool key_required = false;
};

struct response
{
    int status = 200;
    header_list headers;
    std::string body;

    // First value of a header (names compare case-insensitively).
    std::optional<std::string> header_value(std::string_view name) const;
};

// What the winner does with its handler's response: the protocol's
// storage rules (protocol::classify), stated in protocol.toml.
storage_action classify(int status) noexcept;
// What the runner does with it: the storage rules, but a validation
// failure (protocol::validation_statuses) they would finalize is released
// under client_errors::release (config::client_errors()).
storage_action classify(int status, client_errors how) noexcept;

// The marker added to every replayed response.
inline constexpr const char *replay_header_name = protocol::replayed_header.data();

// Case-insensitive ASCII comparison of header names.
bool header_name_equal(std::string_view a, std::string_view b) noexcept;
// Headers never stored, whatever the configuration says (set-cookie,
// authorization, cookies, session and auth tokens).
bool is_never_stored(std::string_view name) noexcept;

// The response headers kept for replay.
class header_allowlist
{
public:
    // The defaults plus the additions of cfg.
    explicit header_allowlist(const config &cfg);
    header_allowlist();
    bool allows(std::string_view name) const noexcept;
    // The allowed headers as a JSON object text {"content-type": "..."} with
    // lower-case names; repeated headers are joined with ", ".
    std::string to_json(const header_list &headers) const;

private:
    std::vector<std::string> names_;
};
// Parses what to_json stored (any JSON object of strings) back to headers.
header_list headers_from_json(std::string_view json);

// An RFC 9457 problem details response (application/problem+json).
struct problem
{
    int status = 500;
    std::string type;   // URI reference; "about:blank" when empty
    std::string title;
    std::string detail;
    std::optional<std::chrono::seconds> retry_after;  // adds Retry-After
};
response make_problem_response(const problem &p);

// Retry-After in whole seconds, rounded up, at least 1.
std::chrono::seconds retry_after_seconds(std::chrono::milliseconds d) noexcept;

// The answers the runner gives instead of running the handler, per profile:
// status, type, title and detail from the protocol's problem table
// (docs/reference/protocol.md).
namespace problems {
// Any of the protocol's problems; retry_after adds Retry-After (problems
// whose table entry has none ignore it).
response make(protocol::problem which, status_profile p,
              std::optional<std::chrono::milliseconds> retry_after = std::nullopt,
              std::string detail = {});
// What the runner answers for a server outcome whose action is answer (or
// wait, once the wait budget is over); retry_after is the server's hint or
// the configured one. std::nullopt for the other actions.
std::optional<response> for_outcome(protocol::server_outcome o, status_profile p,
                                    std::chrono::milliseconds retry_after);
response missing_key(status_profile p);
response invalid_key(status_profile p, key_status why);
response key_reused(status_profile p);
response in_progress(status_profile p, std::chrono::milliseconds retry_after);
response cooldown(status_profile p, std::chrono::milliseconds retry_after);
response not_replayable(status_profile p);
response expired(status_profile p);
response request_too_large(status_profile p, std::size_t limit);
response store_unavailable(status_profile p, std::chrono::milliseconds retry_after);
response outcome_unknown(status_profile p, std::chrono::milliseconds retry_after);
}  // namespace problems

}  // namespace idem
