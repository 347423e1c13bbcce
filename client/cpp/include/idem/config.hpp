// pg_idem C++ client: runner configuration, validated when built.
//
//   auto cfg = idem::config::builder()
//                  .lease(std::chrono::seconds(10))
//                  .follower_wait_budget(std::chrono::seconds(2))
//                  .build();   // idem::config_error if anything is off
#pragma once

#include <idem/diagnostics.hpp>
#include <idem/error.hpp>
#include <idem/pg.hpp>
#include <idem/protocol.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace idem {

using std::chrono::milliseconds;

// status_profile, which status codes a follower and a refused request
// get (ietf, the default, or conflict409; seed, 0.5.0's name of
// conflict409, is deprecated), is the protocol's: idem/protocol.hpp,
// docs/reference/protocol.md. So are the defaults below
// (protocol::defaults) and the limits build() checks (protocol::limits).

// How a waiting follower learns that the winner has finished.
enum class follower_wakeup
{
    // Wait inside the server (idem_claim's max_wait, pg_idem 0.3.0): one
    // call that returns when the winner's result commits. Falls back to
    // polling with backoff when the server's idem_claim has no max_wait.
    // Holds no session state: works behind transaction-mode poolers.
    server_wait,
    // Poll idem_claim / idem_lookup with jittered backoff only.
    polling,
    // 0.2.0's name; the advisory-lock wake-up is gone (it held a session
    // lock, which transaction-mode poolers break). Same as server_wait.
    advisory_lock [[deprecated("the advisory-lock wake-up is gone; use server_wait")]] = server_wait
};

// What the runner does with a handler's validation failure, a status of
// protocol::validation_statuses (400, 422) that the storage rules would
// store (Python's Config.client_errors, Node's storeClientErrors).
enum class client_errors
{
    // Not stored: the key is released, as Stripe does, so the corrected
    // request with the same key runs instead of being answered "key
    // reused". In the fenced and in-transaction modes the handler's writes
    // commit, as for every status that releases the key.
    release,
    // Stored and replayed, as the protocol's storage rules say.
    store,
};

class config
{
public:
    class builder;

    // The defaults (lease 30 s, renew every 10 s, ...), already valid.
    config();

    milliseconds lease() const noexcept { return lease_; }
    milliseconds renew_interval() const noexcept { return renew_interval_; }
    milliseconds follower_wait_budget() const noexcept { return wait_budget_; }
    milliseconds poll_min() const noexcept { return poll_min_; }
    milliseconds poll_max() const noexcept { return poll_max_; }
    double poll_jitter() const noexcept { return poll_jitter_; }
    milliseconds retry_after() const noexcept { return retry_after_; }
    milliseconds failure_cooldown() const noexcept { return failure_cooldown_; }
    std::size_t max_request_body_bytes() const noexcept { return max_request_; }
    std::size_t max_cacheable_response_bytes() const noexcept { return max_response_; }
    unsigned max_iterations() const noexcept { return max_iterations_; }
    unsigned transaction_attempts() const noexcept { return tx_attempts_; }
    status_profile profile() const noexcept { return profile_; }
    follower_wakeup wakeup() const noexcept { return wakeup_; }
    // Validation failures (400, 422): released (the default) or stored.
    idem::client_errors client_errors() const noexcept { return client_errors_; }
    // Named, unnamed or automatic (the default: named, but unnamed behind
    // a pooler) prepared statements.
    pg::preparation prepared_statements() const noexcept { return preparation_; }
    // Longest single wait inside the server (0 = the whole budget). Unless
    // set, 0 on a connection straight to the server and pooled_wait_slice
    // behind a pooler.
    milliseconds server_wait_slice() const noexcept { return wait_slice_; }
    bool server_wait_slice_set() const noexcept { return wait_slice_set_; }
    static constexpr milliseconds pooled_wait_slice = protocol::defaults::pooled_wait_slice;
    // Called with every store error the runner meets (see idem/diagnostics.hpp).
    const error_hook &on_error() const noexcept { return on_error_; }
    // Each cause of store errors is logged once to stderr (default true).
    bool log_errors() const noexcept { return log_errors_; }
    // Lower-case names added to the replay allowlist.
    const std::vector<std::string> &replay_headers() const noexcept { return replay_headers_; }
    // Schema of the pg_idem functions; empty = found through search_path.
    const std::string &schema() const noexcept { return schema_; }
    // A service's name, part of every cache key (empty: none).
    const std::string &key_namespace() const noexcept { return key_namespace_; }

private:
    milliseconds lease_ = protocol::defaults::lease;
    milliseconds renew_interval_ = protocol::defaults::lease / protocol::defaults::renew_divisor;
    milliseconds wait_budget_ = protocol::defaults::follower_wait_budget;
    milliseconds poll_min_ = protocol::defaults::poll_min;
    milliseconds poll_max_ = protocol::defaults::poll_max;
    double poll_jitter_ = protocol::defaults::poll_jitter;
    milliseconds retry_after_ = protocol::defaults::retry_after;
    milliseconds failure_cooldown_ = protocol::defaults::failure_cooldown;
    std::size_t max_request_ = protocol::defaults::max_request_body_bytes;
    std::size_t max_response_ = protocol::defaults::max_cacheable_response_bytes;
    unsigned max_iterations_ = protocol::defaults::max_iterations;
    unsigned tx_attempts_ = protocol::defaults::transaction_attempts;
    status_profile profile_ = protocol::defaults::profile;
    follower_wakeup wakeup_ = follower_wakeup::server_wait;
    idem::client_errors client_errors_ = protocol::defaults::client_errors == "store"
                                             ? idem::client_errors::store
                                             : idem::client_errors::release;
    pg::preparation preparation_ = pg::preparation::automatic;
    milliseconds wait_slice_{0};
    bool wait_slice_set_ = false;
    error_hook on_error_;
    bool log_errors_ = true;
    std::vector<std::string> replay_headers_;
    std::string schema_;
    std::string key_namespace_;
};

// Collects settings; build() checks them together and throws config_error
// with a message naming the setting: zero, negative or inverted values,
// renew_interval >= lease, a lease outside protocol::limits (10 ms to 24
// hours), a key_namespace with a space.
class config::builder
{
public:
    builder();
    // How long a claim lasts without renewal (30 s). Also the time a
    // crashed winner's key stays blocked.
    builder &lease(milliseconds v);
    // How often the winner renews (default lease / 3); must be < lease.
    builder &renew_interval(milliseconds v);
    // How long a follower waits for the winner before answering retryable (5 s).
    builder &follower_wait_budget(milliseconds v);
    // Fallback polling backoff bounds (50 ms to 1 s) and jitter (0.25 = ±25%).
    builder &poll(milliseconds min, milliseconds max);
    builder &poll_jitter(double fraction);
    // Retry-After sent with a pending answer (1 s).
    builder &retry_after(milliseconds v);
    // How long a key stays in cooldown after a 5xx/408/429 (2 s).
    builder &failure_cooldown(milliseconds v);
    // Request bodies above this get 413 (1 MiB).
    builder &max_request_body_bytes(std::size_t v);
    // Responses above this are stored not replayable (2 MiB); the caller
    // still gets the full response.
    builder &max_cacheable_response_bytes(std::size_t v);
    // Hard cap on claim/wait iterations of one request (100).
    builder &max_iterations(unsigned v);
    // Attempts of a fenced or in-transaction handler transaction that hit a
    // serialization failure or deadlock (3; 1 = no retry).
    builder &transaction_attempts(unsigned v);
    builder &profile(status_profile p);
    builder &wakeup(follower_wakeup w);
    // A handler's 400 or 422 (protocol::validation_statuses): release
    // (the default; the corrected request with the same key runs) or
    // store (replayed to every retry with the key, as the storage rules say).
    builder &client_errors(idem::client_errors how);
    // How the runner sends its statements: automatic (the default: named
    // prepared statements, parsed once per connection, on a connection
    // straight to the server; unnamed ones behind a pooler, found out once
    // per connection), always named, or always unnamed (parsed with every
    // execution; what a transaction-mode pooler without
    // max_prepared_statements needs). The defaults work behind PgBouncer.
    builder &prepared_statements(pg::preparation how);
    // The longest a follower waits inside one server call (0: its whole
    // budget in one call). Each waiting follower holds a server connection
    // while it waits: behind a pooler with fewer server connections than
    // waiting followers, the winner's finalize would queue behind them.
    // Slices let it through after at most one slice. Default: the whole
    // budget on a connection straight to the server, slices of
    // pooled_wait_slice (200 ms) behind a pooler.
    builder &server_wait_slice(milliseconds v);
    // Pooler settings whatever the connection looks like: unnamed
    // statements and server waits in slices of 200 ms (true), or the
    // defaults, which find a pooler by themselves (false).
    builder &pooler_mode(bool on);
    // A function called with every store error (the 503s and the results
    // that could not be stored), from the request's thread; it must not
    // throw (what it throws is ignored).
    builder &on_error(error_hook hook);
    // Log each cause of store errors once, to stderr, with its SQLSTATE and
    // the fix (default true); the hook is called either way.
    builder &log_errors(bool on);
    // Adds a header to the replay allowlist (content-type,
    // content-disposition, content-language, cache-control, etag, location).
    // set-cookie, authorization and other session headers are refused.
    builder &replay_header(std::string name);
    // Schema the extension was created in, when it is not on search_path.
    builder &schema(std::string name);
    // A service's name (no spaces), part of every cache key so that two
    // services on one role and route never share a key; the same key as
    // Python's Config(namespace=...) and Node's namespace (it goes before
    // the target: protocol::namespaced_target).
    builder &key_namespace(std::string name);

    config build() const;

private:
    config c_;
    bool renew_set_ = false;
};

} // namespace idem
