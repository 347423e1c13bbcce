// The runner's first-use check of the extension (presence, version,
// schema on the path, EXECUTE, the lease within idem.max_lease), which
// also finds out the server's features, and the reporting of store errors
// (the on_error hook, one log line per cause).
#include "runner/engine.hpp"

#include <idem/version.hpp>

#include <cstdio>
#include <sstream>

namespace idem::detail {

namespace {

// One round trip: every column is what one check needs. The functions
// named are those the runner calls.
const char *const check_sql =
    "SELECT x.extversion, x.nspname, "
    "x.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false)), "
    "(SELECT pg_catalog.string_agg(DISTINCT p.proname::text, ', ') FROM pg_catalog.pg_proc p "
    " WHERE p.pronamespace OPERATOR(pg_catalog.=) x.extnamespace AND p.proname IN "
    " ('idem_claim', 'idem_lookup', 'idem_begin', 'idem_renew', 'idem_finalize', "
    "  'idem_release', 'idem_fail') "
    " AND NOT pg_catalog.has_function_privilege(p.oid, 'EXECUTE')), "
    // max_wait (0.3.0: a fourth argument) and lock_wait (0.6.0: a fifth).
    "EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) x.extnamespace "
    " AND p.proname = 'idem_claim' AND p.pronargs >= 4 "
    " AND p.proargtypes[3] = 'pg_catalog.interval'::pg_catalog.regtype), "
    "EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) x.extnamespace "
    " AND p.proname = 'idem_begin' AND p.pronargs >= 4 "
    " AND p.proargtypes[3] = 'pg_catalog.interval'::pg_catalog.regtype), "
    "(SELECT s.setting FROM pg_catalog.pg_settings s WHERE s.name = 'idem.max_lease'), "
    "CURRENT_USER::text, pg_catalog.current_database()::text, "
    "EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) x.extnamespace "
    " AND p.proname = 'idem_claim' AND p.pronargs = 5 "
    " AND p.proargtypes[4] = 'pg_catalog.interval'::pg_catalog.regtype), "
    // idem_edition() (0.6.0): 'c' or 'sql'; the SQL edition's plain script
    // has no extension row, and is no router.
    "EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) x.extnamespace "
    " AND p.proname = 'idem_edition' AND p.pronargs = 0) "
    "FROM (SELECT) one LEFT JOIN (SELECT e.extversion, e.extnamespace, n.nspname::text "
    " FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n "
    " ON n.oid OPERATOR(pg_catalog.=) e.extnamespace WHERE e.extname = 'pg_idem' "
    // A router without the extension (PL/Proxy, docs/guides/sharding.md):
    // its idem_* functions on the path forward to partitions that have it.
    " UNION ALL SELECT NULL, p.pronamespace, n.nspname::text FROM pg_catalog.pg_proc p "
    " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    " WHERE p.proname = 'idem_claim' AND pg_catalog.pg_function_is_visible(p.oid) "
    " AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_idem') "
    " LIMIT 1) x ON true";

// "0.4.0" -> {0, 4, 0}; missing parts are 0.
std::vector<long> version_parts(std::string_view v)
{
    std::vector<long> out;
    long n = 0;
    bool any = false;
    for (char ch : v)
    {
        if (ch >= '0' && ch <= '9')
        {
            n = n * 10 + (ch - '0');
            any = true;
        }
        else if (ch == '.')
        {
            out.push_back(n);
            n = 0;
            any = false;
        }
        else
            break;
    }
    if (any || !out.empty())
        out.push_back(n);
    while (out.size() < 3)
        out.push_back(0);
    return out;
}

std::string ms_text(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// Which edition answers, once the check row (column 10) found idem_edition
// in the schema (column 1): "c" or "sql".
void ask_edition(pg::connection &conn, const pg::result &r, server_features &f)
{
    if (f.router || !r.get_bool(0, 10))
        return;
    std::string quoted = "\"";
    for (char ch : r.get_text(0, 1))
        quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    f.edition = conn.exec("SELECT " + quoted + "\".idem_edition()").get_text(0, 0);
}

}  // namespace

bool version_older(std::string_view a, std::string_view b)
{
    return version_parts(a) < version_parts(b);
}

server_features engine::features(pg::connection &conn) const
{
    {
        std::lock_guard<std::mutex> lk(features_mu_);
        if (features_)
            return *features_;
    }
    pg::result r;
    try
    {
        r = conn.exec(check_sql);
    }
    catch (const pg::broken_connection &)
    {
        throw;  // the caller's error handling deals with the connection
    }
    catch (const std::exception &)
    {
        return server_features{};  // e.g. no access to the catalog: poll, ask again later
    }
    server_features f = check_row(r);
    ask_edition(conn, r, f);
    std::lock_guard<std::mutex> lk(features_mu_);
    features_ = f;
    return f;
}

server_features engine::check_row(const pg::result &r) const
{
    const std::string role = r.get_optional_text(0, 7).value_or("?");
    const std::string db = r.get_optional_text(0, 8).value_or("?");
    const std::optional<std::string> version = r.get_optional_text(0, 0);
    // No extension but idem_claim on the path: a router, whose partitions
    // have the extension (their versions are theirs to check), or the SQL
    // edition's plain script (it has idem_edition, and is at least 0.6.0).
    const bool on_path = r.get_optional_text(0, 1).has_value();
    const bool router = !version && on_path && !r.get_bool(0, 10);
    if (!version && !on_path)
        throw setup_error("pg_idem: the extension pg_idem is not installed in database \"" + db +
                          "\": CREATE EXTENSION pg_idem there (docs/guides/privileges.md), then "
                          "GRANT idem_client TO " + role + ".");
    if (version && version_older(*version, oldest_extension))
        throw setup_error("pg_idem: the extension in database \"" + db + "\" is " + *version +
                          ", older than " + std::string(oldest_extension) +
                          ", the oldest this client (" + std::string(client_version) +
                          ") supports: ALTER EXTENSION pg_idem UPDATE.");
    const std::string schema = r.get_text(0, 1);
    if (!cfg_.schema().empty() && cfg_.schema() != schema)
        throw setup_error("pg_idem: the extension is in schema \"" + schema +
                          "\", but the runner is configured with schema \"" + cfg_.schema() +
                          "\": config::builder().schema(\"" + schema + "\").");
    if (cfg_.schema().empty() && !r.get_bool(0, 2))
        throw setup_error("pg_idem: the extension's schema \"" + schema +
                          "\" is not on the search_path of role " + role +
                          ": ALTER ROLE " + role + " SET search_path = \"$user\", public, " +
                          schema + " (then reconnect), or config::builder().schema(\"" + schema +
                          "\").");
    if (const std::optional<std::string> denied = r.get_optional_text(0, 3))
        throw setup_error("pg_idem: role " + role + " may not EXECUTE " + *denied +
                          ": GRANT idem_client TO " + role + ".");
    if (const std::optional<std::int64_t> max_lease = r.get_optional_int(0, 6))
    {
        const milliseconds limit(*max_lease);
        if (cfg_.lease() > limit)
            throw setup_error("pg_idem: the runner's lease (" + ms_text(cfg_.lease()) +
                              ") is over the server's idem.max_lease (" + ms_text(limit) +
                              "): lower config lease, or raise idem.max_lease.");
        if (cfg_.failure_cooldown() > limit)
            throw setup_error("pg_idem: the runner's failure_cooldown (" +
                              ms_text(cfg_.failure_cooldown()) +
                              ") is over the server's idem.max_lease (" + ms_text(limit) +
                              "): lower config failure_cooldown, or raise idem.max_lease.");
    }
    server_features f;
    f.claim_wait = r.get_bool(0, 4);
    f.begin_wait = r.get_bool(0, 5);
    f.lock_wait = r.get_bool(0, 9);
    f.router = router;
    f.edition = router ? "" : "c";
    return f;
}

// Fenced and in-transaction modes need the handler's transaction on the
// partition that owns the key: a router runs each call in a transaction of
// its own there (and has no idem_begin), so through it the finalize would
// commit apart from the handler's writes.
void engine::refuse_router(pg::connection &conn, const char *mode) const
{
    if (features(conn).router)
        throw setup_error(std::string("pg_idem: ") + mode +
                          " mode cannot run through a PL/Proxy router, which runs each call in a "
                          "transaction of its own on the partition, apart from the handler's: use "
                          "lease mode through the router, or idem::partitioned_runner "
                          "(idem/partition.hpp, docs/guides/sharding.md).");
}

void engine::check_once() const
{
    {
        std::lock_guard<std::mutex> lk(features_mu_);
        features_.reset();  // ask again: the caller wants today's answer
    }
    connection_handle conn = provider_.acquire();
    pg::result r = conn->exec(check_sql);
    server_features f = check_row(r);
    ask_edition(*conn, r, f);
    std::lock_guard<std::mutex> lk(features_mu_);
    features_ = f;
}

void engine::report(std::exception_ptr error, const char *during) const
{
    if (!error || (!cfg_.on_error() && !cfg_.log_errors()))
        return;
    store_error e = describe_store_error(error, during);
    const bool pool = std::string_view(during) == "connection pool";
    if (pool)
        e.fix = "the pool has " + std::to_string(capacity_.value_or(0)) + " connections, and " +
                std::to_string(duplicates_waiting_.load()) +
                " of this runner's requests were duplicates waiting for their first request: " + e.fix +
                " (simple_pool::options::max_size; config follower_wait_budget)";
    if (cfg_.on_error())
    {
        try
        {
            cfg_.on_error()(e);
        }
        catch (...)
        {
        }
    }
    if (!cfg_.log_errors())
        return;
    // One line per cause: where, and the SQLSTATE (or, without one, the
    // message, which then names the cause).
    const std::string cause = e.during + '\0' + (e.sqlstate.empty() ? e.message : e.sqlstate);
    {
        std::lock_guard<std::mutex> lk(logged_mu_);
        if (!logged_.insert(cause).second)
            return;
    }
    std::ostringstream line;
    line << "pg_idem: " << e.during << (pool ? " exhausted: " : " failed: ");
    if (!e.sqlstate.empty())
        line << e.sqlstate << ' ';
    line << e.message;
    if (e.fix != "see the message.")
        line << ". Fix: " << e.fix;
    line << " (Logged once per cause; the requests are answered 503 until it is fixed.)\n";
    std::fputs(line.str().c_str(), stderr);
}

}  // namespace idem::detail

namespace idem {

void runner::check(std::chrono::milliseconds wait) const { engine_->check(wait); }

}  // namespace idem
