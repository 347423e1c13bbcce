// The message inbox: one delivery, one transaction, the failure accounting.
//
// The server keeps a session-level advisory lock on a message from
// idem_inbox_begin until the attempt is accounted for: committed done, or
// recorded by idem_inbox_fail. A connection given back to a pool with an
// attempt neither committed nor recorded would keep that lock and block
// every other delivery of the message, so every path below ends in one of:
// COMMIT of done; idem_inbox_fail (in the transaction after ROLLBACK TO the
// savepoint, or in autocommit after a ROLLBACK); or closing the connection,
// which makes the server record the attempt as its session ends.
#include <idem/inbox.hpp>

#include <idem/key.hpp>

#include "messaging/detail.hpp"

#include <algorithm>
#include <optional>

namespace idem {

namespace detail {

std::string qualified(const std::string &schema, const char *name)
{
    if (schema.empty())
        return name;
    std::string out = "\"";
    for (char c : schema)
    {
        if (c == '"')
            out += '"';
        out += c;
    }
    return out + "\"." + name;
}

std::string error_text(std::string_view what, std::size_t max_bytes)
{
    std::string out;
    out.reserve(std::min(what.size(), max_bytes));
    for (std::size_t i = 0; i < what.size();)
    {
        const auto c = static_cast<unsigned char>(what[i]);
        std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                      : (c & 0xF8) == 0xF0 ? 4 : 0;
        std::string_view ch;
        if (len > 0 && i + len <= what.size() && is_valid_utf8(what.substr(i, len)))
            ch = what.substr(i, len);
        else
        {
            ch = "?";
            len = 1;
        }
        if (ch.size() == 1 && ch[0] == '\0')
            ch = " ";
        if (out.size() + ch.size() > max_bytes)
            break;
        out.append(ch);
        i += len;
    }
    return out;
}

std::string describe(const std::exception_ptr &e)
{
    if (!e)
        return "no error";
    try
    {
        std::rethrow_exception(e);
    }
    catch (const std::exception &x)
    {
        return x.what();
    }
    catch (...)
    {
        return "an exception that is not a std::exception";
    }
}

void check_schema(const std::string &schema, const char *owner)
{
    if (schema.find('\0') != std::string::npos)
        throw config_error(std::string(owner) + ": schema contains a NUL byte");
}

}  // namespace detail

namespace {

// The server's answer; anything the protocol does not know is an error.
protocol::inbox_answer answer_of(const std::string &s)
{
    const protocol::inbox_answer a = protocol::parse_inbox_answer(s);
    if (a == protocol::inbox_answer::unknown)
        throw pg::failure("pg_idem answered an unknown inbox outcome \"" + s + "\"");
    return a;
}

inbox_outcome outcome_of(const std::string &s) { return protocol::result_of(answer_of(s)); }

// The statements, qualified with the configured schema.
struct inbox_sql
{
    std::string begin, done, fail;

    explicit inbox_sql(const std::string &schema)
        : begin("SELECT " + detail::qualified(schema, "idem_inbox_begin") + "($1, $2, $3, $4)"),
          done("SELECT " + detail::qualified(schema, "idem_inbox_done") + "($1, $2)"),
          fail("SELECT f.outcome, f.error_count, (extract(epoch FROM f.retry_after) * 1000)::int8"
               " FROM " +
               detail::qualified(schema, "idem_inbox_fail") + "($1, $2, $3) f")
    {
    }
};

// Copies what idem_inbox_fail answered into r.
void read_failure(const pg::result &res, inbox_result &r)
{
    r.outcome = outcome_of(res.get_text(0, 0));
    r.error_count = static_cast<int>(res.get_optional_int(0, 1).value_or(0));
    r.retry_after = detail::millis(res.get_optional_int(0, 2));
}

}  // namespace

// The generated names are string literals: data() is NUL-terminated.
const char *to_string(inbox_outcome o) noexcept { return protocol::name(o).data(); }

void inbox_settings::validate() const
{
    if (max_attempts < 1 || max_attempts > protocol::inbox_max_attempts)
        throw config_error("inbox: max_attempts must be between 1 and " +
                           std::to_string(protocol::inbox_max_attempts));
    if (handler_attempts < 1 || handler_attempts > 100)
        throw config_error("inbox: handler_attempts must be between 1 and 100");
    if (max_error_bytes < 16 || max_error_bytes > 1024 * 1024)
        throw config_error("inbox: max_error_bytes must be between 16 and 1 MiB");
    detail::check_schema(schema, "inbox");
}

inbox::inbox(connection_provider &provider, inbox_settings settings)
    : provider_(provider), settings_(std::move(settings))
{
    settings_.validate();
}

inbox_result inbox::handle(const std::string &consumer, const inbox_message &message,
                           const inbox_handler &handler) const
{
    const inbox_sql sql(settings_.schema);
    const std::string id(message.id);
    const std::string payload_hash = to_bytes(sha256(message.payload));
    inbox_result r;

    connection_handle conn = provider_.acquire();
    std::optional<pg::transaction> tx;

    // Begin. Nothing is begun when it fails, so a 40001/40P01 (the message
    // changed under it too often) may simply be tried again.
    protocol::inbox_answer decision = protocol::inbox_answer::unknown;
    for (unsigned attempt = 1;; ++attempt)
    {
        tx.emplace(*conn, settings_.isolation);
        try
        {
            decision = answer_of(tx->exec(sql.begin, consumer, id, pg::as_bytea(payload_hash),
                                          settings_.max_attempts)
                                     .get_text(0, 0));
            break;
        }
        catch (const pg::transaction_rollback &)
        {
            tx.reset();
            if (attempt >= settings_.handler_attempts)
                throw;
        }
    }
    if (decision != protocol::inbox_answer::process)
    {
        tx->commit();  // a cap reached at begin commits the dead letter
        r.outcome = protocol::result_of(decision);
        return r;
    }

    // From here on every path accounts for the attempt (see the top).
    std::exception_ptr failure;
    bool savepoint_usable = false;
    try
    {
        tx->exec("SAVEPOINT idem_handler");
        savepoint_usable = true;
        // Read by the catch below when anything throws; clang's static
        // analyzer does not follow exception edges, so say it is read.
        (void)savepoint_usable;
        for (;;)
        {
            r.handler_ran = true;
            ++r.handler_runs;
            try
            {
                handler(*tx);
                break;
            }
            catch (const pg::transaction_rollback &)
            {
                // Only READ COMMITTED reruns in place: the savepoint drops
                // the handler's writes and locks; a later statement takes a
                // new snapshot.
                if (settings_.isolation != pg::isolation::read_committed ||
                    r.handler_runs >= settings_.handler_attempts || !tx->active())
                    throw;
                tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
            }
        }
        tx->exec("RELEASE SAVEPOINT idem_handler");
        savepoint_usable = false;
        (void)savepoint_usable;  // as above: read if what follows throws
        tx->exec(sql.done, consumer, id);
        tx->commit();
        r.outcome = inbox_outcome::processed;
        return r;
    }
    catch (const pg::unknown_outcome &)
    {
        r.outcome = inbox_outcome::unknown;
        r.error = std::current_exception();
        return r;
    }
    catch (...)
    {
        failure = std::current_exception();
    }
    r.error = failure;
    if (!conn->is_open())
    {
        // The session is gone: the server records the attempt as it ends.
        r.outcome = inbox_outcome::unknown;
        return r;
    }

    const std::string text = detail::error_text(detail::describe(failure), settings_.max_error_bytes);

    // The handler failed inside its savepoint: record it in the same
    // transaction, which keeps the message locked until the record commits.
    if (savepoint_usable && tx->active() && conn->status() != pg::transaction_status::idle)
    {
        try
        {
            tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
            pg::result res = tx->exec(sql.fail, consumer, id, text);
            inbox_result recorded = r;
            read_failure(res, recorded);
            tx->commit();
            return recorded;
        }
        catch (const pg::unknown_outcome &)
        {
            r.outcome = inbox_outcome::unknown;
            return r;
        }
        catch (...)
        {
            // The transaction itself failed (e.g. at COMMIT): below.
        }
    }

    // The transaction is lost: roll it back and record the failure in
    // autocommit on this connection (the server remembers the attempt
    // per session).
    tx.reset();
    try
    {
        if (conn->status() != pg::transaction_status::idle)
            conn->exec("ROLLBACK");
        pg::result res = conn->exec(sql.fail, consumer, id, text);
        read_failure(res, r);
        return r;
    }
    catch (...)
    {
        // Not recorded: close the session, so the server records it on exit
        // and the message's lock goes with it.
        conn->close();
        r.outcome = inbox_outcome::unknown;
        return r;
    }
}

}  // namespace idem
