// pg_idem C++ client: thin RAII wrappers over libpq.
//
// connection owns a PGconn (closed by the destructor), result owns a
// PGresult, transaction rolls back in its destructor unless committed.
// Only parameterized statements are offered (PQexecParams, or prepared
// statements with exec_prepared): values never become SQL text. Errors
// are the exceptions of idem/error.hpp.
//
// libpq's own header is not included here, so using this header does not
// put libpq-fe.h on the include path; native_handle() gives the PGconn to
// code that includes it.
#pragma once

#include <idem/error.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

extern "C" {
struct pg_conn;
struct pg_result;
}

namespace idem::pg {

using oid = unsigned int;
inline constexpr oid bool_oid = 16;
inline constexpr oid bytea_oid = 17;
inline constexpr oid int8_oid = 20;
inline constexpr oid int4_oid = 23;
inline constexpr oid text_oid = 25;
inline constexpr oid interval_oid = 1186;
inline constexpr oid uuid_oid = 2950;
inline constexpr oid jsonb_oid = 3802;

// Wire format of a parameter or of a result's columns.
enum class format : int
{
    text = 0,
    binary = 1
};

// One statement parameter: a value (or NULL), its wire format and type oid
// (0 lets the server infer the type from the statement).
class param
{
public:
    static param null(oid type = 0) { return param(std::nullopt, format::text, type); }
    static param text(std::string value, oid type = 0)
    {
        return param(std::move(value), format::text, type);
    }
    static param binary(std::string value, oid type)
    {
        return param(std::move(value), format::binary, type);
    }

    bool is_null() const noexcept { return !value_.has_value(); }
    const std::string &value() const { return *value_; }
    format wire_format() const noexcept { return format_; }
    oid type() const noexcept { return type_; }

private:
    param(std::optional<std::string> v, format f, oid t)
        : value_(std::move(v)), format_(f), type_(t)
    {
    }
    std::optional<std::string> value_;
    format format_;
    oid type_;
};

// Marks a byte string as bytea; it is sent in binary, unescaped.
struct bytea_view
{
    std::string_view bytes;
};
inline bytea_view as_bytea(std::string_view bytes) { return bytea_view{bytes}; }

// Conversions used by exec(sql, args...). Add overloads of to_param in
// namespace idem::pg for your own types.
inline param to_param(param p) { return p; }
inline param to_param(std::string_view s) { return param::text(std::string(s)); }
inline param to_param(const std::string &s) { return param::text(s); }
inline param to_param(const char *s) { return s ? param::text(s) : param::null(); }
inline param to_param(bytea_view b) { return param::binary(std::string(b.bytes), bytea_oid); }
inline param to_param(bool b) { return param::text(b ? "true" : "false", bool_oid); }
inline param to_param(std::nullopt_t) { return param::null(); }
template <typename T>
std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, param> to_param(T v)
{
    return param::text(std::to_string(v), sizeof(T) > 4 ? int8_oid : int4_oid);
}
// A duration is sent as an interval with microsecond precision.
template <typename Rep, typename Period>
param to_param(std::chrono::duration<Rep, Period> d)
{
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    return param::text(std::to_string(us) + " microseconds", interval_oid);
}
template <typename T>
param to_param(const std::optional<T> &v)
{
    return v ? to_param(*v) : param::null();
}

// The rows of one statement. Values are read by position; a column's wire
// format decides how typed getters decode it.
class result
{
public:
    result() = default;
    explicit result(pg_result *res) noexcept;

    std::size_t size() const noexcept;
    bool empty() const noexcept { return size() == 0; }
    int columns() const noexcept;
    // Position of a column by name; std::out_of_range when absent.
    int column(const char *name) const;

    bool is_null(std::size_t row, int col) const;
    // The value's bytes exactly as received (text, or the binary encoding).
    std::string_view raw(std::size_t row, int col) const;
    std::string get_text(std::size_t row, int col) const { return std::string(raw(row, col)); }
    std::optional<std::string> get_optional_text(std::size_t row, int col) const;
    // int2/int4/int8 in either wire format.
    std::int64_t get_int(std::size_t row, int col) const;
    std::optional<std::int64_t> get_optional_int(std::size_t row, int col) const;
    bool get_bool(std::size_t row, int col) const;
    // A bytea value decoded to its bytes (binary, hex or escape text form).
    std::string get_bytea(std::size_t row, int col) const;

    // Command tag ("INSERT 0 1", "COMMIT", ...) and rows affected.
    std::string command_status() const;
    std::uint64_t affected_rows() const;

    pg_result *native_handle() const noexcept { return res_.get(); }

private:
    struct deleter
    {
        void operator()(pg_result *r) const noexcept;
    };
    void check(std::size_t row, int col) const;
    std::unique_ptr<pg_result, deleter> res_;
};

// Transaction state of a connection as libpq tracks it.
enum class transaction_status
{
    idle,           // no transaction open
    active,         // a statement is running
    in_transaction, // BEGIN ... idle inside
    in_error,       // inside a failed transaction
    unknown         // connection bad
};

// How exec_prepared sends a statement.
enum class preparation
{
    // Parsed once per connection under a name and executed by name after
    // that (the first use sends Parse and Execute in one round trip).
    // Needs a server session per connection: not behind a transaction-mode
    // pooler older than PgBouncer 1.21 (max_prepared_statements).
    named,
    // Parsed with every execution as the unnamed statement (what
    // PQexecParams does): works through any pooler.
    unnamed,
    // Named on a connection straight to the server, unnamed behind a
    // pooler (the default of the runner). The first statement sent this
    // way asks the server for its backend's pid: a pooler answers the
    // client with a pid of its own, so the two differ behind one (asked
    // with the connection's first Parse, in the same round trip). A named
    // statement that still meets a
    // pooler's clash (42P05 "already exists", 26000 "does not exist")
    // outside a transaction switches the connection to unnamed statements
    // and is sent again, unnamed.
    automatic
};

// One statement of a pipeline (connection::exec_pipeline).
struct statement
{
    std::string sql;
    std::vector<param> params;
    format result_format = format::text;
};

// One libpq connection. Not thread safe: use one per thread (the runner
// takes them from a connection_provider). Move-only.
class connection
{
public:
    // Connects with a libpq connection string or URI; broken_connection on
    // failure.
    explicit connection(const std::string &conninfo);
    // Takes ownership of an open PGconn, e.g. one borrowed from an
    // application's own pool.
    static connection adopt(pg_conn *conn);
    // Gives up ownership without closing (see adopt()).
    pg_conn *release() noexcept { return conn_.release(); }
    connection(connection &&) noexcept;
    connection &operator=(connection &&) noexcept;
    connection(const connection &) = delete;
    connection &operator=(const connection &) = delete;
    ~connection();

    // Runs one parameterized statement: exec("SELECT $1::int + $2", 1, 2).
    template <typename... Args>
    result exec(std::string_view sql, Args &&...args)
    {
        return exec_params(sql, std::vector<param>{to_param(std::forward<Args>(args))...});
    }
    // The same with explicit parameters and the result columns' format.
    result exec_params(std::string_view sql, const std::vector<param> &params,
                       format result_format = format::text);

    // Runs sql as a prepared statement. With preparation::named it is
    // parsed once on this connection (cached by text and parameter types)
    // and executed by name afterwards; a statement the server no longer
    // knows (DISCARD ALL, a pooler that switched servers) is parsed again
    // when no transaction is open.
    result exec_prepared(std::string_view sql, const std::vector<param> &params,
                         format result_format = format::text,
                         preparation how = preparation::named);

    // Sends the statements in one flight (libpq's pipeline mode, one Sync:
    // one round trip) and returns their results in order. Each is prepared
    // as `how` says; `automatic` asks for the backend pid first (once per
    // connection, its own round trip) so that the flight never meets a
    // pooler's name clash. The first statement that fails throws as exec
    // would; the ones after it were not run. Outside a transaction the
    // statements run in one implicit transaction.
    std::vector<result> exec_pipeline(const std::vector<statement> &stmts,
                                      preparation how = preparation::unnamed);

    // Messages exchanges with the server (statements, COMMIT, BEGIN...)
    // since the connection was opened: a statement's Parse and Execute sent
    // together count once. For tests and diagnostics.
    std::uint64_t round_trips() const noexcept { return round_trips_; }
    // Statements this connection has prepared under a name.
    std::size_t prepared_count() const noexcept { return prepared_.size(); }
    // Whether this connection goes through a pooler, as preparation::automatic
    // found out (std::nullopt until it asked; true once a named statement met
    // a pooler's clash).
    std::optional<bool> behind_pooler() const noexcept { return behind_pooler_; }
    // Asks now (one round trip) unless known; the answer is kept.
    bool detect_pooler();

    bool is_open() const noexcept;
    transaction_status status() const noexcept;
    int backend_pid() const noexcept;
    // Libpq's last error message (for diagnostics).
    std::string error_message() const;
    // Closes the connection now (a pool then discards it).
    void close() noexcept { conn_.reset(); }
    // The PGconn; still owned by this object.
    pg_conn *native_handle() const noexcept { return conn_.get(); }

private:
    friend class transaction;
    struct adopt_tag
    {
    };
    connection(adopt_tag, pg_conn *conn);
    // Runs COMMIT and maps a lost connection to unknown_outcome.
    void commit_statement();
    // The same for a COMMIT's result.
    void check_commit(result res);
    // Turns a finished statement's result into a result or an exception.
    result checked(result res, std::string_view sql);
    // Parse (named) + Bind/Execute + Sync in one pipeline; records the name.
    // ask_pid: the server's pid in the same round trip (automatic).
    result prepare_and_exec(const std::string &key, std::string_view sql,
                            const std::vector<param> &params, format result_format,
                            bool ask_pid);
    result exec_named(std::string_view sql, const std::vector<param> &params,
                      format result_format, bool ask_pid);
    // The pipeline's results, unchecked (lost: the connection died in it).
    std::vector<result> send_pipeline(const std::vector<statement> &stmts, preparation how,
                                      bool &lost);

    struct deleter
    {
        void operator()(pg_conn *c) const noexcept;
    };
    std::unique_ptr<pg_conn, deleter> conn_;
    std::unordered_map<std::string, std::string> prepared_;  // sql + types -> name
    std::uint64_t round_trips_ = 0;
    std::uint64_t statements_named_ = 0;
    std::optional<bool> behind_pooler_;
};

enum class isolation
{
    read_committed,
    repeatable_read,
    serializable
};

// BEGIN ... COMMIT on a connection. The destructor rolls back a
// transaction that was neither committed nor rolled back, and swallows any
// error doing so (the connection may be gone).
// BEGIN can ride with the first pipeline (defer_begin): one round trip
// fewer.
struct defer_begin_t
{
};
inline constexpr defer_begin_t defer_begin{};

class transaction
{
public:
    explicit transaction(connection &c, isolation level = isolation::read_committed);
    // BEGIN is sent with the first statement: in the same flight by
    // exec_pipeline and commit_with, before it by the others.
    transaction(connection &c, isolation level, defer_begin_t);
    transaction(const transaction &) = delete;
    transaction &operator=(const transaction &) = delete;
    ~transaction();

    template <typename... Args>
    result exec(std::string_view sql, Args &&...args)
    {
        return exec_params(sql, std::vector<param>{to_param(std::forward<Args>(args))...});
    }
    result exec_params(std::string_view sql, const std::vector<param> &params,
                       format result_format = format::text);
    result exec_prepared(std::string_view sql, const std::vector<param> &params,
                         format result_format = format::text,
                         preparation how = preparation::named);

    // The statements in one flight (connection::exec_pipeline), BEGIN first
    // when it is still to be sent.
    std::vector<result> exec_pipeline(const std::vector<statement> &stmts,
                                      preparation how = preparation::unnamed);

    // COMMIT. unknown_outcome when the connection is lost while it is in
    // flight; sql_error (rolled back for sure) when the server refuses it,
    // e.g. a deferred constraint or a serialization failure at commit.
    void commit();
    // The statements and COMMIT in one flight; their results. A statement
    // that fails throws its error and COMMIT did not run (the transaction
    // is aborted: roll it back); a refused COMMIT or a lost connection is
    // as commit() says.
    std::vector<result> commit_with(const std::vector<statement> &stmts,
                                    preparation how = preparation::unnamed);
    void rollback();
    bool active() const noexcept { return active_; }
    connection &conn() noexcept { return conn_; }

private:
    void send_begin();

    connection &conn_;
    bool active_ = false;
    const char *begin_sql_ = "BEGIN";
    bool begin_pending_ = false;
};

} // namespace idem::pg
