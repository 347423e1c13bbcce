// pg_idem C++ client: exceptions.
//
// Database errors are keyed by SQLSTATE the way libpqxx does it: a class per
// SQLSTATE class (23 integrity, 40 transaction rollback, ...) with the
// conditions a caller reacts to as subclasses, so `catch
// (idem::pg::serialization_failure const&)` and `catch
// (idem::pg::transaction_rollback const&)` both work.
#pragma once

#include <stdexcept>
#include <string>

namespace idem {

// A configuration value was refused when the configuration was built.
class config_error : public std::invalid_argument
{
public:
    using std::invalid_argument::invalid_argument;
};

// An Idempotency-Key (or a tuple for idem_key) that the server would refuse.
class invalid_key : public std::invalid_argument
{
public:
    using std::invalid_argument::invalid_argument;
};

// pg_idem cannot be used as configured: the extension is missing from the
// database or older than idem::oldest_extension, its schema is neither on
// the search_path nor configured, the role may not EXECUTE its functions,
// or the lease is over the server's idem.max_lease. The message says which
// and what to do. Thrown by runner::check(); held in run_result::error of
// the requests answered 503 meanwhile.
class setup_error : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

// No connection of the application's pool came free in time: what a
// bounded connection_provider throws (idem::simple_pool with a max_size).
// Not a database error: the server was never asked. The runner answers
// 503 connection-pool-exhausted (protocol.toml [client.pool]) and logs the
// fix, never "the server cannot be reached".
class pool_exhausted : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

namespace pg {

// Base of every error raised while talking to PostgreSQL.
class failure : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

// The connection could not be made or was lost. Any statement in flight did
// not complete as far as the client knows; an open transaction is gone.
class broken_connection : public failure
{
public:
    explicit broken_connection(const std::string &what, std::string sqlstate = {});
    // SQLSTATE the server sent before closing (57P01 after
    // pg_terminate_backend), empty when the socket simply died.
    const std::string &sqlstate() const noexcept { return sqlstate_; }

private:
    std::string sqlstate_;
};

// The connection was lost while COMMIT was in flight: the transaction may or
// may not have committed. Never retry the work blindly; read the state back.
class unknown_outcome : public failure
{
public:
    explicit unknown_outcome(const std::string &what, std::string sqlstate = {});
    const std::string &sqlstate() const noexcept { return sqlstate_; }

private:
    std::string sqlstate_;
};

// Every field PostgreSQL reports with an error (see libpq PQresultErrorField).
struct error_fields
{
    std::string sqlstate;
    std::string severity;
    std::string message;    // primary message
    std::string detail;
    std::string hint;
    std::string constraint; // constraint name (errtableconstraint)
    std::string schema;
    std::string table;
    std::string column;
    std::string statement;  // the SQL text that failed
};

// The server refused a statement; the connection is still usable.
class sql_error : public failure
{
public:
    explicit sql_error(error_fields fields);
    const std::string &sqlstate() const noexcept { return f_.sqlstate; }
    const std::string &message() const noexcept { return f_.message; }
    const std::string &detail() const noexcept { return f_.detail; }
    const std::string &hint() const noexcept { return f_.hint; }
    const std::string &constraint() const noexcept { return f_.constraint; }
    const std::string &table() const noexcept { return f_.table; }
    const std::string &statement() const noexcept { return f_.statement; }
    const error_fields &fields() const noexcept { return f_; }
    // The two-character SQLSTATE class ("40", "23", "IL", ...).
    std::string sqlstate_class() const { return f_.sqlstate.substr(0, 2); }

private:
    error_fields f_;
};

#define IDEM_PG_ERROR(name, base)                      \
    class name : public base                           \
    {                                                  \
    public:                                            \
        using base::base;                              \
    }

// Class 22: data exception.
IDEM_PG_ERROR(data_exception, sql_error);
IDEM_PG_ERROR(invalid_parameter_value, data_exception);   // 22023
IDEM_PG_ERROR(null_value_not_allowed, data_exception);    // 22004
// Class 23: integrity constraint violation.
IDEM_PG_ERROR(integrity_constraint_violation, sql_error);
IDEM_PG_ERROR(not_null_violation, integrity_constraint_violation);     // 23502
IDEM_PG_ERROR(foreign_key_violation, integrity_constraint_violation);  // 23503
IDEM_PG_ERROR(unique_violation, integrity_constraint_violation);       // 23505
IDEM_PG_ERROR(check_violation, integrity_constraint_violation);        // 23514
IDEM_PG_ERROR(exclusion_violation, integrity_constraint_violation);    // 23P01
// Class 40: transaction rollback; the retry helper retries the two below.
IDEM_PG_ERROR(transaction_rollback, sql_error);
IDEM_PG_ERROR(serialization_failure, transaction_rollback);  // 40001
IDEM_PG_ERROR(deadlock_detected, transaction_rollback);      // 40P01
// Class 42: syntax error or access rule violation (42883: is the extension installed?).
IDEM_PG_ERROR(syntax_error_or_access_rule_violation, sql_error);
IDEM_PG_ERROR(undefined_function, syntax_error_or_access_rule_violation);  // 42883
// 55P03 (lock_timeout) and 57014 (statement_timeout or cancel).
IDEM_PG_ERROR(lock_not_available, sql_error);
IDEM_PG_ERROR(query_canceled, sql_error);
// 55000: a pg_idem call out of protocol order (an inbox message done twice
// or begun again before its failed attempt was recorded; idem_stats without
// shared_preload_libraries).
IDEM_PG_ERROR(object_not_in_prerequisite_state, sql_error);
// Class IL: pg_idem's own conditions.
IDEM_PG_ERROR(idem_error, sql_error);
IDEM_PG_ERROR(lease_lost, idem_error);        // IL001: strict finalize of a claim no longer owned
IDEM_PG_ERROR(claim_unfinished, idem_error);  // IL002: idem_begin claim neither finalized nor released at COMMIT
IDEM_PG_ERROR(inbox_unfinished, idem_error);  // IL003: inbox message begun but neither done nor failed at COMMIT
IDEM_PG_ERROR(illegal_transition, idem_error);  // IL005: an attempt transition the state machine forbids
IDEM_PG_ERROR(promotion_unpublished, idem_error);  // IL006: attempt promotion committed without its outbox event

#undef IDEM_PG_ERROR

// Throws the most specific sql_error subclass for fields.sqlstate.
[[noreturn]] void throw_sql_error(error_fields fields);

} // namespace pg
} // namespace idem
