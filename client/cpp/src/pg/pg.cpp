// RAII wrappers over libpq: connection, result, transaction.
#include <idem/pg.hpp>

#include "pg/wire.hpp"

#include <libpq-fe.h>

#include <idem/protocol.hpp>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <stdexcept>

namespace idem::pg {

using detail::statement_key;
using detail::wire_params;

namespace {

// libpq's default notice processor prints to stderr; a library stays quiet
// (pg_advisory_unlock's "you don't own a lock" warning, for one).
void ignore_notice(void *, const char *) {}

std::string field(const PGresult *r, int code)
{
    const char *v = PQresultErrorField(r, code);
    return v ? std::string(v) : std::string();
}

error_fields fields_of(const PGresult *r, std::string_view sql)
{
    error_fields f;
    f.sqlstate = field(r, PG_DIAG_SQLSTATE);
    f.severity = field(r, PG_DIAG_SEVERITY);
    f.message = field(r, PG_DIAG_MESSAGE_PRIMARY);
    f.detail = field(r, PG_DIAG_MESSAGE_DETAIL);
    f.hint = field(r, PG_DIAG_MESSAGE_HINT);
    f.constraint = field(r, PG_DIAG_CONSTRAINT_NAME);
    f.schema = field(r, PG_DIAG_SCHEMA_NAME);
    f.table = field(r, PG_DIAG_TABLE_NAME);
    f.column = field(r, PG_DIAG_COLUMN_NAME);
    f.statement = std::string(sql);
    if (f.message.empty())
    {
        const char *m = PQresultErrorMessage(r);
        f.message = m ? m : "";
        while (!f.message.empty() && (f.message.back() == '\n' || f.message.back() == ' '))
            f.message.pop_back();
    }
    return f;
}

// SQLSTATEs after which the server closes the session (class 08 and the
// admin shutdown / crash codes): the connection is gone, not just the
// statement.
bool connection_ending(const std::string &sqlstate)
{
    return sqlstate.empty() || sqlstate.compare(0, 2, "08") == 0 ||
           sqlstate.compare(0, 3, "57P") == 0;
}

std::string trimmed(const char *msg)
{
    std::string s = msg ? msg : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
    return s.empty() ? std::string("connection to the server lost") : s;
}

// libpq keeps no SQLSTATE for a connection the server refused: the
// server's words tell it (protocol.toml [[connect_message]]), so that a
// role or database that does not exist is not taken for a server that
// cannot be reached.
std::string connect_sqlstate(const std::string &message)
{
    static const std::vector<std::pair<std::string, std::regex>> known = [] {
        std::vector<std::pair<std::string, std::regex>> v;
        for (const protocol::connect_message &m : protocol::connect_messages)
            v.emplace_back(std::string(m.sqlstate), std::regex(std::string(m.pattern)));
        return v;
    }();
    for (const auto &[state, pattern] : known)
        if (std::regex_search(message, pattern))
            return state;
    return {};
}

int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

}  // namespace

// ---- result -------------------------------------------------------------

void result::deleter::operator()(pg_result *r) const noexcept { PQclear(r); }

result::result(pg_result *res) noexcept : res_(res) {}

std::size_t result::size() const noexcept
{
    return res_ ? static_cast<std::size_t>(PQntuples(res_.get())) : 0;
}

int result::columns() const noexcept { return res_ ? PQnfields(res_.get()) : 0; }

int result::column(const char *name) const
{
    int c = res_ ? PQfnumber(res_.get(), name) : -1;
    if (c < 0)
        throw std::out_of_range(std::string("no column named ") + name);
    return c;
}

void result::check(std::size_t row, int col) const
{
    if (row >= size() || col < 0 || col >= columns())
        throw std::out_of_range("result: row or column out of range");
}

bool result::is_null(std::size_t row, int col) const
{
    check(row, col);
    return PQgetisnull(res_.get(), static_cast<int>(row), col) != 0;
}

std::string_view result::raw(std::size_t row, int col) const
{
    check(row, col);
    return std::string_view(PQgetvalue(res_.get(), static_cast<int>(row), col),
                            static_cast<std::size_t>(PQgetlength(res_.get(), static_cast<int>(row), col)));
}

std::optional<std::string> result::get_optional_text(std::size_t row, int col) const
{
    if (is_null(row, col))
        return std::nullopt;
    return get_text(row, col);
}

std::int64_t result::get_int(std::size_t row, int col) const
{
    if (is_null(row, col))
        throw std::domain_error("result: NULL where an integer was expected");
    std::string_view v = raw(row, col);
    if (PQfformat(res_.get(), col) == 1)
    {
        std::uint64_t u = 0;
        for (unsigned char ch : v)
            u = (u << 8) | ch;
        switch (v.size())
        {
        case 2:
            return static_cast<std::int16_t>(static_cast<std::uint16_t>(u));
        case 4:
            return static_cast<std::int32_t>(static_cast<std::uint32_t>(u));
        case 8:
            return static_cast<std::int64_t>(u);
        default:
            throw std::domain_error("result: binary value is not an integer");
        }
    }
    std::int64_t out = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || p != v.data() + v.size())
        throw std::domain_error("result: not an integer: " + std::string(v));
    return out;
}

std::optional<std::int64_t> result::get_optional_int(std::size_t row, int col) const
{
    if (is_null(row, col))
        return std::nullopt;
    return get_int(row, col);
}

bool result::get_bool(std::size_t row, int col) const
{
    if (is_null(row, col))
        throw std::domain_error("result: NULL where a boolean was expected");
    std::string_view v = raw(row, col);
    if (PQfformat(res_.get(), col) == 1)
        return v.size() == 1 && v[0] != 0;
    return v == "t" || v == "true";
}

std::string result::get_bytea(std::size_t row, int col) const
{
    if (is_null(row, col))
        throw std::domain_error("result: NULL where bytea was expected");
    std::string_view v = raw(row, col);
    if (PQfformat(res_.get(), col) == 1)
        return std::string(v);
    if (v.size() >= 2 && v[0] == '\\' && v[1] == 'x')
    {
        std::string out;
        out.reserve((v.size() - 2) / 2);
        for (std::size_t i = 2; i + 1 < v.size(); i += 2)
        {
            int hi = hexval(v[i]), lo = hexval(v[i + 1]);
            if (hi < 0 || lo < 0)
                throw std::domain_error("result: malformed hex bytea");
            out.push_back(static_cast<char>(hi * 16 + lo));
        }
        return out;
    }
    std::size_t len = 0;
    std::string text(v);
    unsigned char *buf =
        PQunescapeBytea(reinterpret_cast<const unsigned char *>(text.c_str()), &len);
    if (!buf)
        throw std::bad_alloc();
    std::string out(reinterpret_cast<char *>(buf), len);
    PQfreemem(buf);
    return out;
}

std::string result::command_status() const
{
    return res_ ? std::string(PQcmdStatus(res_.get())) : std::string();
}

std::uint64_t result::affected_rows() const
{
    const char *t = res_ ? PQcmdTuples(res_.get()) : "";
    std::uint64_t n = 0;
    std::from_chars(t, t + std::strlen(t), n);
    return n;
}

// ---- connection ---------------------------------------------------------

void connection::deleter::operator()(pg_conn *c) const noexcept { PQfinish(c); }

connection::connection(const std::string &conninfo) : conn_(PQconnectdb(conninfo.c_str()))
{
    if (!conn_)
        throw broken_connection("out of memory allocating a connection");
    if (PQstatus(conn_.get()) != CONNECTION_OK)
    {
        const std::string message = trimmed(PQerrorMessage(conn_.get()));
        throw broken_connection(message, connect_sqlstate(message));
    }
    PQsetNoticeProcessor(conn_.get(), ignore_notice, nullptr);
}

connection::connection(adopt_tag, pg_conn *conn) : conn_(conn) {}

connection connection::adopt(pg_conn *conn)
{
    if (!conn || PQstatus(conn) != CONNECTION_OK)
        throw broken_connection("adopt: the connection is not open");
    PQsetNoticeProcessor(conn, ignore_notice, nullptr);
    return connection(adopt_tag{}, conn);
}

connection::connection(connection &&) noexcept = default;
connection &connection::operator=(connection &&) noexcept = default;
connection::~connection() = default;

bool connection::is_open() const noexcept
{
    return conn_ && PQstatus(conn_.get()) == CONNECTION_OK;
}

transaction_status connection::status() const noexcept
{
    if (!conn_)
        return transaction_status::unknown;
    switch (PQtransactionStatus(conn_.get()))
    {
    case PQTRANS_IDLE:
        return transaction_status::idle;
    case PQTRANS_ACTIVE:
        return transaction_status::active;
    case PQTRANS_INTRANS:
        return transaction_status::in_transaction;
    case PQTRANS_INERROR:
        return transaction_status::in_error;
    default:
        return transaction_status::unknown;
    }
}

int connection::backend_pid() const noexcept { return conn_ ? PQbackendPID(conn_.get()) : 0; }

std::string connection::error_message() const
{
    return conn_ ? trimmed(PQerrorMessage(conn_.get())) : std::string("no connection");
}

result connection::checked(result res, std::string_view sql)
{
    PGresult *r = res.native_handle();
    if (!r)
        throw broken_connection(error_message());
    switch (PQresultStatus(r))
    {
    case PGRES_COMMAND_OK:
    case PGRES_TUPLES_OK:
    case PGRES_EMPTY_QUERY:
        return res;
    case PGRES_FATAL_ERROR:
    case PGRES_NONFATAL_ERROR:
    {
        error_fields f = fields_of(r, sql);
        if (!is_open() || connection_ending(f.sqlstate))
            throw broken_connection(f.message.empty() ? error_message() : f.message, f.sqlstate);
        throw_sql_error(std::move(f));
    }
    default:
        throw failure("unsupported result status " + std::string(PQresStatus(PQresultStatus(r))) +
                      " (COPY is not supported)");
    }
}

result connection::exec_params(std::string_view sql, const std::vector<param> &params,
                               format result_format)
{
    if (!is_open())
        throw broken_connection("connection is not open: " + error_message());
    const std::string text(sql);
    const wire_params w(params);
    ++round_trips_;
    return checked(result(PQexecParams(conn_.get(), text.c_str(), w.count(), w.types.data(),
                                       w.values.data(), w.lengths.data(), w.formats.data(),
                                       static_cast<int>(result_format))),
                   sql);
}

bool connection::detect_pooler()
{
    if (behind_pooler_)
        return *behind_pooler_;
    // The pid of BackendKeyData is the server's own on a direct connection;
    // PgBouncer (and other poolers) hand the client a key of their own.
    const std::int64_t server_pid = exec("SELECT pg_catalog.pg_backend_pid()").get_int(0, 0);
    behind_pooler_ = server_pid != backend_pid();
    return *behind_pooler_;
}

namespace {
// What a transaction-mode pooler does to named statements: the server
// session already has the name (another client prepared it, 42P05) or
// does not have it (this client prepared it on another server, 26000).
bool pooler_clash(const sql_error &e)
{
    return e.sqlstate() == "42P05" || e.sqlstate() == "26000";
}
}  // namespace

result connection::exec_prepared(std::string_view sql, const std::vector<param> &params,
                                 format result_format, preparation how)
{
    if (how == preparation::automatic)
    {
        if (!is_open())
            throw broken_connection("connection is not open: " + error_message());
        if (behind_pooler_.value_or(false))
            return exec_params(sql, params, result_format);
        const bool in_block = status() != transaction_status::idle;
        try
        {
            // Not known yet: the first Parse on this connection asks for
            // the pid in the same round trip.
            return exec_named(sql, params, result_format, !behind_pooler_.has_value());
        }
        catch (const sql_error &e)
        {
            // Outside a transaction the failed Parse or Bind did nothing:
            // from now on this connection sends its statements unnamed.
            if (!pooler_clash(e))
                throw;
            behind_pooler_ = true;
            prepared_.clear();
            if (in_block)
                throw;
            return exec_params(sql, params, result_format);
        }
    }
    if (how == preparation::unnamed)
        return exec_params(sql, params, result_format);
    return exec_named(sql, params, result_format, false);
}

result connection::exec_named(std::string_view sql, const std::vector<param> &params,
                              format result_format, bool ask_pid)
{
    if (!is_open())
        throw broken_connection("connection is not open: " + error_message());
    const std::string key = statement_key(sql, params);
    auto it = prepared_.find(key);
    if (it == prepared_.end())
        return prepare_and_exec(key, sql, params, result_format, ask_pid);
    const wire_params w(params);
    const bool in_block = status() != transaction_status::idle;
    ++round_trips_;
    try
    {
        return checked(result(PQexecPrepared(conn_.get(), it->second.c_str(), w.count(),
                                             w.values.data(), w.lengths.data(), w.formats.data(),
                                             static_cast<int>(result_format))),
                       sql);
    }
    catch (const sql_error &e)
    {
        // 26000: the session lost the statement (DISCARD ALL, or a pooler
        // handed us another server). Outside a transaction nothing was
        // done: parse it again. Inside one, the error stands.
        if (e.sqlstate() != "26000")
            throw;
        prepared_.erase(key);
        if (in_block)
            throw;
        return prepare_and_exec(key, sql, params, result_format, ask_pid);
    }
}

result connection::prepare_and_exec(const std::string &key, std::string_view sql,
                                    const std::vector<param> &params, format result_format,
                                    bool ask_pid)
{
    const std::string text(sql);
    const std::string name = "pg_idem_" + std::to_string(++statements_named_);
    const wire_params w(params);
    PGconn *c = conn_.get();
    // Parse, then Bind/Describe/Execute, then one Sync: the same messages as
    // PQexecParams but for the statement's name, in one round trip.
    if (!PQenterPipelineMode(c))
        throw failure("pg: cannot enter pipeline mode: " + error_message());
    struct leave
    {
        PGconn *c;
        ~leave() { PQexitPipelineMode(c); }
    } guard{c};
    ++round_trips_;
    static const char pid_sql[] = "SELECT pg_catalog.pg_backend_pid()";
    if (ask_pid && !PQsendQueryParams(c, pid_sql, 0, nullptr, nullptr, nullptr, nullptr, 0))
        throw broken_connection(error_message());
    if (!PQsendPrepare(c, name.c_str(), text.c_str(), w.count(), w.types.data()) ||
        !PQsendQueryPrepared(c, name.c_str(), w.count(), w.values.data(), w.lengths.data(),
                             w.formats.data(), static_cast<int>(result_format)) ||
        !PQpipelineSync(c))
        throw broken_connection(error_message());
    // Collect everything up to the Sync before deciding (the pipeline must
    // be drained before leaving it).
    result parsed, executed;
    bool parse_ok = false;
    int stage = ask_pid ? -1 : 0;  // -1: the pid, 0: prepare result, 1: query result, 2: sync
    for (;;)
    {
        PGresult *r = PQgetResult(c);
        if (!r)
        {
            if (!is_open())
                throw broken_connection(error_message());
            continue;  // end of one command's results
        }
        const ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC)
        {
            PQclear(r);
            break;
        }
        if (stage == -1)
        {
            // The server's pid against the one the connection was given:
            // they differ behind a pooler (see preparation::automatic).
            if (st == PGRES_TUPLES_OK && PQntuples(r) == 1)
                behind_pooler_ = std::atoi(PQgetvalue(r, 0, 0)) != PQbackendPID(c);
            PQclear(r);
            stage = 0;
        }
        else if (stage == 0)
        {
            parse_ok = st == PGRES_COMMAND_OK;
            parsed = result(r);
            stage = 1;
        }
        else if (stage == 1)
        {
            executed = result(r);
            stage = 2;
        }
        else
            PQclear(r);
    }
    if (!parse_ok)
        return checked(std::move(parsed), sql);
    prepared_.emplace(key, name);
    return checked(std::move(executed), sql);
}

void connection::commit_statement()
{
    if (!is_open())
        throw broken_connection("connection lost before COMMIT: " + error_message());
    ++round_trips_;
    check_commit(result(PQexec(conn_.get(), "COMMIT")));
}

void connection::check_commit(result res)
{
    PGresult *r = res.native_handle();
    if (!r)
        throw unknown_outcome("connection lost while COMMIT was in flight: " + error_message());
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR)
    {
        error_fields f = fields_of(r, "COMMIT");
        if (!is_open() || connection_ending(f.sqlstate))
            throw unknown_outcome("connection lost while COMMIT was in flight: " +
                                      (f.message.empty() ? error_message() : f.message),
                                  f.sqlstate);
        throw_sql_error(std::move(f));
    }
    if (!is_open())
        throw unknown_outcome("connection lost while COMMIT was in flight: " + error_message());
    if (std::strcmp(PQcmdStatus(r), "ROLLBACK") == 0)
    {
        error_fields f;
        f.sqlstate = "25P02";
        f.message = "COMMIT rolled back: a statement of the transaction had failed";
        f.statement = "COMMIT";
        throw sql_error(std::move(f));
    }
}

// ---- transaction --------------------------------------------------------

namespace {
const char *begin_statement(isolation level)
{
    if (level == isolation::repeatable_read)
        return "BEGIN ISOLATION LEVEL REPEATABLE READ";
    if (level == isolation::serializable)
        return "BEGIN ISOLATION LEVEL SERIALIZABLE";
    return "BEGIN";
}
}  // namespace

transaction::transaction(connection &c, isolation level) : conn_(c)
{
    if (c.status() != transaction_status::idle)
        throw std::logic_error("transaction: the connection is not idle");
    begin_sql_ = begin_statement(level);
    conn_.exec(begin_sql_);
    active_ = true;
}

transaction::transaction(connection &c, isolation level, defer_begin_t) : conn_(c)
{
    if (c.status() != transaction_status::idle)
        throw std::logic_error("transaction: the connection is not idle");
    begin_sql_ = begin_statement(level);
    begin_pending_ = true;
    active_ = true;
}

void transaction::send_begin()
{
    if (!begin_pending_)
        return;
    begin_pending_ = false;
    try
    {
        conn_.exec(begin_sql_);
    }
    catch (...)
    {
        active_ = false;
        throw;
    }
}

result transaction::exec_prepared(std::string_view sql, const std::vector<param> &params,
                                  format result_format, preparation how)
{
    if (!active_)
        throw std::logic_error("transaction: already committed or rolled back");
    send_begin();
    try
    {
        return conn_.exec_prepared(sql, params, result_format, how);
    }
    catch (const broken_connection &)
    {
        active_ = false;  // the server rolled it back with the session
        throw;
    }
}

result transaction::exec_params(std::string_view sql, const std::vector<param> &params,
                                format result_format)
{
    if (!active_)
        throw std::logic_error("transaction: already committed or rolled back");
    send_begin();
    try
    {
        return conn_.exec_params(sql, params, result_format);
    }
    catch (const broken_connection &)
    {
        active_ = false;  // the server rolled it back with the session
        throw;
    }
}

void transaction::commit()
{
    if (!active_)
        throw std::logic_error("transaction: already committed or rolled back");
    send_begin();
    active_ = false;
    conn_.commit_statement();
}

void transaction::rollback()
{
    if (!active_)
        return;
    active_ = false;
    if (begin_pending_)
    {
        begin_pending_ = false;  // nothing was sent
        return;
    }
    if (!conn_.is_open())
        return;
    conn_.exec("ROLLBACK");
}

}  // namespace idem::pg
