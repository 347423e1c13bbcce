// runner::check() at start-up (protocol.toml [client.startup]): it refuses
// to start, saying what to fix, when the database cannot serve the runner
// (a role or database that does not exist, a refused login, the extension
// missing or too old, a role without EXECUTE or without the schema on its
// path), and waits a bounded time for a server that does not answer yet
// (nothing listens at the address or socket, it is starting up: 57P03, it
// is full: 53300), which may be starting beside the service. Before, only
// the first requests found such a role or socket, each answered 503.
#include "runner/engine.hpp"

#include <cstdio>

namespace idem::detail {

namespace {

// A server that did not answer (no SQLSTATE and not the server's words), or
// one that asks to be tried again.
bool worth_waiting(const std::string &sqlstate, const std::string &message)
{
    if (sqlstate.empty())
        return message.find("FATAL:") == std::string::npos;
    if (sqlstate.compare(0, 2, "08") == 0)
        return true;
    for (std::string_view s : protocol::startup_retry_sqlstates)
        if (sqlstate == s)
            return true;
    return false;
}

std::string first_line(const std::string &s) { return s.substr(0, s.find('\n')); }

}  // namespace

namespace {

// One try of the check: true when it passed, else the SQLSTATE and first
// line of what failed (a setup_error, or anything not a database error,
// goes up as it is).
bool tried(const engine &e, std::string &sqlstate, std::string &message)
{
    try
    {
        e.check_once();
        return true;
    }
    catch (const pg::broken_connection &x)
    {
        sqlstate = x.sqlstate();
        message = first_line(x.what());
    }
    catch (const pg::sql_error &x)
    {
        sqlstate = x.sqlstate();
        message = first_line(x.what());
    }
    return false;
}

}  // namespace

void engine::check(milliseconds wait) const
{
    const clock::time_point end = clock::now() + wait;
    for (unsigned tries = 1;; ++tries)
    {
        std::string sqlstate, message;
        if (tried(*this, sqlstate, message))
            return;
        if (!worth_waiting(sqlstate, message))
            throw setup_error("pg_idem: the database refused this runner at start-up: " + message +
                              ". Fix: " + fix_for(sqlstate, message));
        if (clock::now() >= end)
            throw setup_error("pg_idem: no server answered within " + std::to_string(wait.count()) +
                              " ms at start-up: " + message +
                              ". Fix: check the connection string's host and port (or socket "
                              "directory), and that PostgreSQL (or the pooler) runs there.");
        if (cfg_.on_error())
        {
            store_error e;
            e.during = "start-up check";
            e.sqlstate = sqlstate;
            e.message = message;
            e.fix = "waiting up to " + std::to_string(wait.count()) + " ms for the server";
            try
            {
                cfg_.on_error()(e);
            }
            catch (...)
            {
            }
        }
        if (tries == 1 && cfg_.log_errors())
            std::fprintf(stderr, "pg_idem: waiting up to %lld ms for the server at start-up: %s\n",
                         static_cast<long long>(wait.count()), message.c_str());
        std::this_thread::sleep_for(std::min({remaining(end), milliseconds(1000),
                                              milliseconds(50LL << std::min(tries, 5u))}));
    }
}

}  // namespace idem::detail
