// Shared by the inbox/outbox and reconciler integration tests: their own
// database, idem_client_msg_test, with a fresh pg_idem and the tables the
// handlers and finalizers write to.
#pragma once

#include "test_support.hpp"

#include <idem/inbox.hpp>
#include <idem/outbox.hpp>
#include <idem/reconciler.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

namespace idem_msg_test {

inline constexpr const char *database = "idem_client_msg_test";

// msg_gated has a deferred trigger that, at COMMIT, waits for advisory lock
// (4243, 1) in shared mode: a test holding it freezes a COMMIT in flight.
inline constexpr const char *setup_sql[] = {
    "DROP EXTENSION IF EXISTS pg_idem CASCADE",
    "CREATE EXTENSION pg_idem",
    "DROP TABLE IF EXISTS msg_effects, msg_deferred, msg_gated, documents CASCADE",
    "CREATE TABLE msg_effects (id bigserial PRIMARY KEY, key text NOT NULL, note text)",
    "CREATE TABLE msg_deferred (k int CONSTRAINT msg_deferred_k UNIQUE DEFERRABLE INITIALLY DEFERRED)",
    "CREATE TABLE msg_gated (key text NOT NULL)",
    "CREATE OR REPLACE FUNCTION msg_gate_commit() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN PERFORM pg_advisory_xact_lock_shared(4243, 1); RETURN NULL; END$$",
    "CREATE CONSTRAINT TRIGGER msg_gated_commit_gate AFTER INSERT ON msg_gated"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION msg_gate_commit()",
    "CREATE TABLE documents (attempt_id uuid PRIMARY KEY, object_key text NOT NULL)",
    "SELECT idem_attempt_register_kind('doc', 'append', 'docs')",
    "SELECT idem_attempt_register_kind('avatar', 'replace', 'avatars')",
};

// The DSN of idem_client_msg_test, created and set up on first use.
inline const std::string &dsn()
{
    static std::once_flag once;
    static std::string value;
    std::call_once(once, [] {
        const std::string base = idem_test::base_dsn();
        {
            idem::pg::connection admin(base);
            if (admin.exec("SELECT 1 FROM pg_database WHERE datname = $1", database).empty())
            {
                try
                {
                    admin.exec(std::string("CREATE DATABASE ") + database);
                }
                catch (const idem::pg::sql_error &e)
                {
                    if (e.sqlstate() != "42P04")  // created concurrently
                        throw;
                }
            }
        }
        value = idem_test::dsn_with(base, "dbname", database);
        idem::pg::connection c(value);
        for (const char *sql : setup_sql)
            c.exec(sql);
    });
    return value;
}

// One statement on a fresh connection; the first value of the first row.
template <typename... Args>
idem::pg::result query(const std::string &sql, Args &&...args)
{
    idem::pg::connection c(dsn());
    return c.exec(sql, std::forward<Args>(args)...);
}

inline long long count(const std::string &sql_from_where, const std::string &arg)
{
    return query("SELECT count(*) " + sql_from_where, arg).get_int(0, 0);
}

// Polls pred every 5 ms until it holds or timeout passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20))
{
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until)
    {
        if (pred())
            return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return pred();
}

}  // namespace idem_msg_test
