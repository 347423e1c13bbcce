#include "test_support.hpp"

#include <chrono>
#include <thread>

#include <libpq-fe.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <stdexcept>

namespace idem_test {

namespace {

constexpr const char *test_database = "idem_client_test";

// Objects the tests write to. gated_effects has a deferred trigger that, at
// COMMIT, waits for advisory lock (4242, 1) in shared mode: a test holding
// it exclusively freezes a transaction inside its COMMIT.
constexpr const char *setup_sql[] = {
    "DROP EXTENSION IF EXISTS pg_idem CASCADE",
    "CREATE EXTENSION pg_idem",
    "DROP TABLE IF EXISTS effects, gated_effects, counters, uniq CASCADE",
    "CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, generation bigint,"
    " who text, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE gated_effects (id bigserial PRIMARY KEY, key text NOT NULL)",
    "CREATE OR REPLACE FUNCTION gate_commit() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN PERFORM pg_advisory_xact_lock_shared(4242, 1); RETURN NULL; END$$",
    "CREATE CONSTRAINT TRIGGER gated_effects_commit_gate AFTER INSERT ON gated_effects"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION gate_commit()",
    "CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)",
    "CREATE TABLE uniq (k int CONSTRAINT uniq_k UNIQUE)",
};

std::string quote_value(const std::string &v)
{
    std::string out = "'";
    for (char c : v)
    {
        if (c == '\'' || c == '\\')
            out += '\\';
        out += c;
    }
    return out + "'";
}

std::string setup_database()
{
    const std::string base = base_dsn();
    std::string target = dsn_with(base, "dbname", test_database);
    {
        idem::pg::connection admin(base);
        if (admin.exec("SELECT 1 FROM pg_database WHERE datname = $1", test_database).empty())
        {
            try
            {
                admin.exec(std::string("CREATE DATABASE ") + test_database);
            }
            catch (const idem::pg::sql_error &e)
            {
                if (e.sqlstate() == "42501")  // no CREATEDB: use the DSN's own database
                    target = base;
                else if (e.sqlstate() != "42P04")  // 42P04: created concurrently
                    throw;
            }
        }
    }
    idem::pg::connection c(target);
    for (const char *sql : setup_sql)
    {
        try
        {
            c.exec(sql);
        }
        catch (const idem::pg::sql_error &e)
        {
            // Not allowed to re-create the extension: use the installed one.
            const bool extension_step = std::string(sql).find("EXTENSION") != std::string::npos;
            if (!(extension_step && e.sqlstate() == "42501" &&
                  !c.exec("SELECT 1 FROM pg_extension WHERE extname = 'pg_idem'").empty()))
                throw;
        }
    }
    return target;
}

}  // namespace

std::string base_dsn()
{
    const char *v = std::getenv("PG_IDEM_TEST_DSN");
    return v ? std::string(v) : std::string();
}

const std::string &dsn()
{
    static std::once_flag once;
    static std::string value;
    std::call_once(once, [] { value = setup_database(); });
    return value;
}

std::string dsn_with(const std::string &dsn, const std::string &keyword, const std::string &value)
{
    char *err = nullptr;
    PQconninfoOption *opts = PQconninfoParse(dsn.c_str(), &err);
    if (!opts)
    {
        std::string msg = err ? err : "invalid connection string";
        PQfreemem(err);
        throw std::invalid_argument(msg);
    }
    std::string out;
    for (PQconninfoOption *o = opts; o->keyword; ++o)
    {
        if (keyword == o->keyword || !o->val)
            continue;
        out += std::string(o->keyword) + "=" + quote_value(o->val) + " ";
    }
    PQconninfoFree(opts);
    return out + keyword + "=" + quote_value(value);
}

idem::config::builder config_builder()
{
    return idem::config::builder().pooler_mode(std::getenv("PG_IDEM_TEST_POOLER") != nullptr);
}

std::string unique_key(const std::string &prefix)
{
    static std::mt19937_64 rng{std::random_device{}()};
    static std::mutex mu;
    std::lock_guard<std::mutex> lk(mu);
    return prefix + "-" + std::to_string(rng());
}

long long count_rows(const std::string &table, const std::string &key)
{
    idem::pg::connection c(dsn());
    return c.exec("SELECT count(*) FROM " + table + " WHERE key = $1", key).get_int(0, 0);
}

long long server_counter(const std::string &name)
{
    idem::pg::connection c(dsn());
    return c.exec("SELECT value FROM idem_stats WHERE counter = $1", name).get_int(0, 0);
}

void wait_for_counter(const std::string &name, long long at_least)
{
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    idem::pg::connection c(dsn());
    for (;;)
    {
        const long long v =
            c.exec("SELECT value FROM idem_stats WHERE counter = $1", name).get_int(0, 0);
        if (v >= at_least)
            return;
        if (std::chrono::steady_clock::now() > deadline)
            FAIL() << "idem_stats." << name << " stayed at " << v << ", below " << at_least;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

}  // namespace idem_test
