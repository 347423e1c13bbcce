// Store errors that explain themselves: the fix for each cause a
// deployment meets, and the store_error the on_error hook and the log get.
#include <idem/diagnostics.hpp>
#include <idem/error.hpp>
#include <idem/protocol.hpp>

namespace idem {

namespace {

struct known_fix
{
    const char *sqlstate;  // exact, or a two-character class
    const char *fix;
};

// The causes a deployment meets first, by SQLSTATE (exact codes before
// their class).
const known_fix fixes[] = {
    {"42501", "GRANT idem_client TO the application's role (the role the runner connects as)."},
    {"42883",
     "the pg_idem functions are not found: CREATE EXTENSION pg_idem in this database, and put its "
     "schema on the role's search_path (ALTER ROLE ... SET search_path) or name it with "
     "config::builder().schema(...)."},
    {"3F000", "the configured schema does not exist: config::builder().schema(...) must name the "
              "schema pg_idem was created in."},
    {"42P05", "a transaction-mode pooler shares server sessions: keep prepared_statements "
              "automatic (the default) or unnamed."},
    {"26000", "a transaction-mode pooler shares server sessions: keep prepared_statements "
              "automatic (the default) or unnamed."},
    {"22023", "a value is outside the server's limits: keep config lease and failure_cooldown "
              "within idem.max_lease."},
    {"53300", "the server has no connection slot left: bound the application's pool (and the "
              "pooler's) below max_connections."},
    {"28000", "the server refused the role: check the connection string's user (does the role "
              "exist, may it log in?) and pg_hba.conf."},
    {"28P01", "the password was refused: check the connection string's password (or .pgpass)."},
    {"3D000", "the connection string names a database that does not exist: check its dbname."},
    {"57014", "a statement_timeout shorter than the follower wait budget cancelled it: raise "
              "statement_timeout for the role or lower follower_wait_budget."},
    {"55P03", "a lock was held longer than the wait budget (an idem_begin transaction): shorten "
              "the transactions that hold idempotency keys."},
    {"55000", "pg_idem needs shared_preload_libraries = 'pg_idem' for this; add it and restart "
              "the server."},
    {"08", "the server cannot be reached: check the connection string, the server and the "
           "pooler."},
    {"57P", "the server is shutting down or restarting: retried requests recover once it is "
            "back."},
    {"40", "transactions kept conflicting: retry later, or lower the contention on the key."},
};

}  // namespace

std::string fix_for(std::string_view sqlstate, std::string_view message)
{
    if (sqlstate.empty())
        return message.find("connection") != std::string_view::npos
                   ? "the server cannot be reached: check the connection string, the server and "
                     "the pooler."
                   : "see the message.";
    for (const known_fix &f : fixes)
    {
        const std::string_view code(f.sqlstate);
        if (sqlstate.substr(0, code.size()) == code)
            return f.fix;
    }
    return "see the server's message (SQLSTATE " + std::string(sqlstate) + ").";
}

store_error describe_store_error(std::exception_ptr e, std::string during)
{
    store_error out;
    out.during = std::move(during);
    out.error = e;
    if (!e)
    {
        out.message = "unknown error";
        out.fix = "see the message.";
        return out;
    }
    try
    {
        std::rethrow_exception(e);
    }
    catch (const setup_error &x)
    {
        out.message = x.what();
        out.fix = "see the message.";
        return out;
    }
    catch (const pool_exhausted &x)
    {
        // Not the server's: never "the server cannot be reached".
        out.message = x.what();
        out.fix = std::string(protocol::pool_exhausted_fix) + ".";
        return out;
    }
    catch (const pg::sql_error &x)
    {
        out.sqlstate = x.sqlstate();
        out.message = x.message();
    }
    catch (const pg::broken_connection &x)
    {
        out.sqlstate = x.sqlstate();
        out.message = x.what();
    }
    catch (const pg::unknown_outcome &x)
    {
        out.sqlstate = x.sqlstate();
        out.message = x.what();
    }
    catch (const std::exception &x)
    {
        out.message = x.what();
    }
    catch (...)
    {
        out.message = "a non-standard exception";
    }
    out.fix = fix_for(out.sqlstate, out.message);
    return out;
}

}  // namespace idem
