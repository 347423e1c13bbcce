// pg_idem C++ client: store errors that explain themselves.
//
// A runner answers a request it cannot guard with 503 (store unavailable,
// or outcome unknown once the handler ran). What caused it goes three
// ways: run_result::error holds the exception; the config's on_error hook
// gets a store_error for every one; and each cause (its SQLSTATE and where
// it happened) is logged once to stderr, with the fix, unless
// config::builder().log_errors(false):
//
//   pg_idem: claim failed: 42501 permission denied for function idem_claim.
//   Fix: GRANT idem_client TO the application's role. (Logged once per
//   cause; the requests are answered 503 until it is fixed.)
//
// At its first use (and from runner::check()) the runner checks the
// extension: installed in this database, no older than
// idem::oldest_extension, its schema on the search_path or configured,
// EXECUTE on the functions the runner calls, and the lease and cooldown
// within idem.max_lease. What fails is an idem::setup_error.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <string_view>

namespace idem {

struct store_error
{
    // What the runner was doing: "start-up check", "claim", "finalize", ...
    std::string during;
    // The server's SQLSTATE; empty when there is none (no connection, or a
    // start-up check, whose message says what is wrong).
    std::string sqlstate;
    std::string message;
    // What to do about it, in one sentence.
    std::string fix;
    std::exception_ptr error;
};

using error_hook = std::function<void(const store_error &)>;

// The fix for an error: by SQLSTATE, for the ones a deployment causes
// (privileges, search_path, a pooler, connection limits, timeouts).
std::string fix_for(std::string_view sqlstate, std::string_view message);

// A store_error for an exception (sqlstate and message from a pg::sql_error
// or pg::broken_connection; setup_error's message already says the fix).
store_error describe_store_error(std::exception_ptr e, std::string during);

}  // namespace idem
