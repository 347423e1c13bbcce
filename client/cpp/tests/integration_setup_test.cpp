// What a deployment gets wrong first, caught at the runner's first use
// with one clear message (idem::setup_error, the log line, the on_error
// hook) instead of a silent 503 per request; and named statements that
// meet a pooler's clash, recovered by switching the connection to unnamed
// ones. Each test has a database of its own (idem_client_setup_test),
// made the way the test needs it.
#include "test_support.hpp"

#include <idem/version.hpp>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;

namespace {

constexpr const char *setup_db = "idem_client_setup_test";
constexpr const char *plain_role = "idem_setup_plain";

bool behind_pooler() { return std::getenv("PG_IDEM_TEST_POOLER") != nullptr; }

// A fresh database idem_client_setup_test, then statements in it as the
// superuser; returns its DSN.
std::string fresh_database(const std::vector<std::string> &statements)
{
    {
        pg::connection admin(idem_test::base_dsn());
        admin.exec(std::string("DROP DATABASE IF EXISTS ") + setup_db + " WITH (FORCE)");
        admin.exec(std::string("CREATE DATABASE ") + setup_db);
        admin.exec(std::string("DROP ROLE IF EXISTS ") + plain_role);
        admin.exec(std::string("CREATE ROLE ") + plain_role + " LOGIN");
    }
    const std::string dsn = idem_test::dsn_with(idem_test::base_dsn(), "dbname", setup_db);
    pg::connection c(dsn);
    for (const std::string &s : statements)
        c.exec(s);
    return dsn;
}

// The message runner::check() refuses with, or "" when it passes.
std::string check_message(const std::string &dsn, config cfg = idem_test::config_builder().build())
{
    simple_pool pool(dsn);
    runner run(pool, std::move(cfg));
    try
    {
        run.check();
        return "";
    }
    catch (const setup_error &e)
    {
        return e.what();
    }
}

response ok(const claim_context &) { return response{201, {}, "made"}; }

}  // namespace

#define IDEM_REQUIRE_OWN_SESSIONS()                                                \
    do                                                                             \
    {                                                                              \
        IDEM_REQUIRE_DB();                                                         \
        if (behind_pooler())                                                       \
            GTEST_SKIP() << "creates databases and roles and connects as them";    \
    } while (0)

TEST(Setup, PassesOnAWorkingInstall)
{
    IDEM_REQUIRE_DB();
    EXPECT_EQ(check_message(idem_test::dsn()), "");
}

TEST(Setup, RefusesADatabaseWithoutTheExtension)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    const std::string msg = check_message(fresh_database({}));
    EXPECT_NE(msg.find("is not installed in database \"idem_client_setup_test\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("CREATE EXTENSION pg_idem"), std::string::npos) << msg;
}

TEST(Setup, RefusesAnExtensionOlderThanTheOldestSupported)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    // The package installs no version before the oldest: one is stamped by hand.
    const std::string msg = check_message(fresh_database(
        {"CREATE EXTENSION pg_idem",
         "UPDATE pg_catalog.pg_extension SET extversion = '0.2.0' WHERE extname = 'pg_idem'"}));
    EXPECT_NE(msg.find("is 0.2.0, older than " + std::string(oldest_extension)), std::string::npos) << msg;
    EXPECT_NE(msg.find("ALTER EXTENSION pg_idem UPDATE"), std::string::npos) << msg;
}

TEST(Setup, RefusesASchemaOffTheSearchPath)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    const std::string dsn = fresh_database({"CREATE SCHEMA idem", "CREATE EXTENSION pg_idem SCHEMA idem"});
    const std::string msg = check_message(dsn);
    EXPECT_NE(msg.find("schema \"idem\" is not on the search_path"), std::string::npos) << msg;
    // Naming the schema is one of the two fixes the message gives.
    EXPECT_EQ(check_message(dsn, idem_test::config_builder().schema("idem").build()), "");
    const std::string wrong = check_message(dsn, idem_test::config_builder().schema("other").build());
    EXPECT_NE(wrong.find("configured with schema \"other\""), std::string::npos) << wrong;
}

TEST(Setup, RefusesARoleWithoutExecute)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    const std::string dsn = fresh_database({"CREATE EXTENSION pg_idem"});
    const std::string msg = check_message(idem_test::dsn_with(dsn, "user", plain_role));
    EXPECT_NE(msg.find(std::string("role ") + plain_role + " may not EXECUTE"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("GRANT idem_client TO ") + plain_role), std::string::npos) << msg;
}

// The lease is std::chrono, checked against the server's idem.max_lease
// (1 h by default) before any claim asks for it.
TEST(Setup, RefusesALeaseOverTheServersMaxLease)
{
    IDEM_REQUIRE_DB();
    const std::string msg =
        check_message(idem_test::dsn(), idem_test::config_builder().lease(2h).build());
    EXPECT_NE(msg.find("lease (7200000 ms) is over the server's idem.max_lease (3600000 ms)"),
              std::string::npos) << msg;
}

// Without the check, each of these requests was a silent 503: now each
// carries the setup_error, the hook sees every one, and the log says it
// once.
TEST(Setup, AStoreErrorIsHookedEveryTimeAndLoggedOnce)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    const std::string dsn = fresh_database({"CREATE EXTENSION pg_idem"});
    simple_pool pool(idem_test::dsn_with(dsn, "user", plain_role));
    std::vector<store_error> seen;
    runner run(pool, idem_test::config_builder()
                         .on_error([&](const store_error &e) { seen.push_back(e); })
                         .build());
    testing::internal::CaptureStderr();
    for (int i = 0; i < 3; ++i)
    {
        idem_test::test_request rq{idem_test::unique_key("hooked")};
        run_result r = run.run(rq.view(), ok);
        EXPECT_EQ(r.response.status, 503);
        EXPECT_FALSE(r.handler_ran);
        EXPECT_TRUE(r.error);
    }
    const std::string log = testing::internal::GetCapturedStderr();
    ASSERT_EQ(seen.size(), 3u);
    EXPECT_EQ(seen[0].during, "claim");
    EXPECT_NE(seen[0].message.find("may not EXECUTE"), std::string::npos) << seen[0].message;
    std::size_t lines = 0;
    for (std::size_t at = log.find("pg_idem: claim failed"); at != std::string::npos;
         at = log.find("pg_idem: claim failed", at + 1))
        ++lines;
    EXPECT_EQ(lines, 1u) << log;
    EXPECT_NE(log.find(std::string("GRANT idem_client TO ") + plain_role), std::string::npos) << log;
}

// A server error with a SQLSTATE gets its fix: the log line and the hook's
// store_error name both.
TEST(Setup, AServerErrorIsLoggedWithItsSqlstateAndFix)
{
    IDEM_REQUIRE_DB();
    const store_error e = describe_store_error(
        [] {
            try
            {
                pg::connection c(idem_test::dsn());
                c.exec("SELECT no_such_function_idem()");
            }
            catch (...)
            {
                return std::current_exception();
            }
            return std::exception_ptr();
        }(),
        "claim");
    EXPECT_EQ(e.sqlstate, "42883");
    EXPECT_NE(e.fix.find("search_path"), std::string::npos) << e.fix;
}

// ---- prepared statements and a pooler ----------------------------------------

namespace {

// Makes the names a connection's next named statements would get exist
// already in its server session, as a transaction-mode pooler's other
// clients leave them.
void squat_statement_names(pg::connection &c)
{
    const std::size_t next = c.prepared_count() + 1;
    for (std::size_t n = next; n < next + 4; ++n)
        c.exec("PREPARE pg_idem_" + std::to_string(n) + " AS SELECT 1");
}

}  // namespace

TEST(Statements, AutomaticStaysNamedOnADirectConnection)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    pg::connection c(idem_test::dsn());
    const std::uint64_t before = c.round_trips();
    EXPECT_EQ(c.exec_prepared("SELECT $1::int + 1", {pg::to_param(1)}, pg::format::text,
                              pg::preparation::automatic)
                  .get_int(0, 0),
              2);
    // The pid was asked in the same round trip as the Parse.
    EXPECT_EQ(c.round_trips() - before, 1u);
    ASSERT_TRUE(c.behind_pooler().has_value());
    EXPECT_FALSE(*c.behind_pooler());
    EXPECT_EQ(c.prepared_count(), 1u);
}

// What PgBouncer in transaction mode does to named statements (42P05 from
// another client's pg_idem_1 on the same server session), recovered: the
// connection switches to unnamed statements and the statement is sent
// again; the named mode still fails, as 0.4.0's default did.
TEST(Statements, AutomaticSwitchesToUnnamedOnAPoolersClash)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    pg::connection c(idem_test::dsn());
    squat_statement_names(c);
    EXPECT_THROW(c.exec_prepared("SELECT $1::int + 1", {pg::to_param(1)}, pg::format::text,
                                 pg::preparation::named),
                 pg::sql_error);
    EXPECT_EQ(c.exec_prepared("SELECT $1::int + 1", {pg::to_param(1)}, pg::format::text,
                              pg::preparation::automatic)
                  .get_int(0, 0),
              2);
    EXPECT_EQ(c.behind_pooler(), std::optional<bool>(true));
    EXPECT_EQ(c.exec_prepared("SELECT $1::int + 2", {pg::to_param(1)}, pg::format::text,
                              pg::preparation::automatic)
                  .get_int(0, 0),
              3);
    EXPECT_EQ(c.prepared_count(), 0u);
}

// The runner with its defaults on such a connection: the request is
// answered, not 503.
TEST(Statements, RunnerDefaultsSurviveAPoolersClash)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    pg::connection c(idem_test::dsn());
    squat_statement_names(c);
    struct one_connection : connection_provider
    {
        std::unique_ptr<pg::connection> conn;
        connection_handle acquire() override
        {
            if (!conn)
                throw pg::broken_connection("taken");
            return connection_handle(std::move(conn),
                                     [this](std::unique_ptr<pg::connection> back) { conn = std::move(back); });
        }
    } provider;
    provider.conn = std::make_unique<pg::connection>(std::move(c));
    runner run(provider, config::builder().lease(10s).build());
    idem_test::test_request rq{idem_test::unique_key("clash-default")};
    run_result r = run.run(rq.view(), ok);
    EXPECT_EQ(r.outcome, outcome::won_completed) << r.response.status << " " << r.response.body;
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(run.run(rq.view(), ok).outcome, outcome::replay);
}

// A follower whose claim waits on an in-transaction winner's uncommitted
// key gives up with its budget, answered in progress while the winner still
// runs: with lock_wait passed to the current extension, and with
// lock_timeout set around the call on 0.5.0's, which has no lock_wait.
TEST(Setup, ALockWaitEndsWithTheBudgetInBothForms)
{
    IDEM_REQUIRE_OWN_SESSIONS();
    for (const char *version : {"", "0.5.0"})
    {
        SCOPED_TRACE(*version ? version : "current");
        const std::string dsn = fresh_database(
            {*version ? std::string("CREATE EXTENSION pg_idem VERSION '") + version + "'"
                      : std::string("CREATE EXTENSION pg_idem")});
        simple_pool pool(dsn);
        runner winner(pool, idem_test::config_builder().build());
        runner follower(pool, idem_test::config_builder().follower_wait_budget(400ms).build());
        idem_test::test_request req{idem_test::unique_key("lockwait")};
        std::mutex mu;
        std::condition_variable cv;
        bool holding = false, release = false;
        std::thread t([&] {
            winner.run_in_transaction(req.view(), [&](pg::transaction &, const claim_context &) {
                std::unique_lock<std::mutex> lk(mu);
                holding = true;
                cv.notify_all();
                cv.wait_for(lk, 120s, [&] { return release; });
                return response{201, {}, "winner"};
            });
        });
        {
            std::unique_lock<std::mutex> lk(mu);
            ASSERT_TRUE(cv.wait_for(lk, 120s, [&] { return holding; }));
        }
        // Without the budget the follower would wait for the winner's
        // commit, which comes only after this returns (or after 120 s: a
        // replay then, not 409).
        const run_result r = follower.run(req.view(), ok);
        {
            std::lock_guard<std::mutex> lk(mu);
            release = true;
        }
        cv.notify_all();
        t.join();
        EXPECT_EQ(r.response.status, 409);
        EXPECT_FALSE(r.handler_ran);
    }
}
