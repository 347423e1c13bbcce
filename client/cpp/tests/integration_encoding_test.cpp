// Against a SQL_ASCII database (what initdb makes when the environment sets
// no locale; issue 24 item 12): libpq hands text over as the server's bytes
// and the runner reads only ASCII outcomes, so every mode works there, and
// stored headers outside ASCII replay byte for byte.
#include "test_support.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

constexpr const char *ascii_database = "idem_client_ascii";

// The DSN of a fresh SQL_ASCII database with pg_idem ("" without CREATEDB).
std::string ascii_dsn()
{
    pg::connection admin(idem_test::base_dsn());
    admin.exec(std::string("DROP DATABASE IF EXISTS ") + ascii_database + " WITH (FORCE)");
    try
    {
        admin.exec(std::string("CREATE DATABASE ") + ascii_database +
                   " ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    }
    catch (const pg::sql_error &e)
    {
        if (e.sqlstate() == "42501")
            return "";
        throw;
    }
    const std::string dsn = idem_test::dsn_with(idem_test::base_dsn(), "dbname", ascii_database);
    pg::connection c(dsn);
    c.exec("CREATE EXTENSION pg_idem");
    c.exec("CREATE TABLE effects (key text NOT NULL, note text)");
    return dsn;
}

// Drops the database when the test ends (declared before its pool).
struct drop_ascii_database
{
    ~drop_ascii_database()
    {
        try
        {
            pg::connection admin(idem_test::base_dsn());
            admin.exec(std::string("DROP DATABASE IF EXISTS ") + ascii_database + " WITH (FORCE)");
        }
        catch (const std::exception &)
        {
        }
    }
};

}  // namespace

TEST(SqlAscii, EveryModeClaimsReplaysAndRefusesAnotherBody)
{
    IDEM_REQUIRE_DB();
    drop_ascii_database dropped;
    const std::string dsn = ascii_dsn();
    if (dsn.empty())
        GTEST_SKIP() << "no CREATEDB: SQL_ASCII test skipped";
    {
        pg::connection c(dsn);
        ASSERT_EQ(c.exec("SHOW server_encoding").get_text(0, 0), "SQL_ASCII");
    }
    simple_pool pool(dsn, 8);
    runner run(pool, idem_test::config_builder().follower_wait_budget(2s).build());
    const std::string location = "/payments/\xc3\xa9";  // é in UTF-8
    int runs = 0;
    auto lease = [&](const claim_context &) {
        ++runs;
        return response{201, {{"Content-Type", "application/json"}, {"Location", location}},
                        "{\"id\":\"\xc3\xa9\"}"};
    };
    idem_test::test_request rq{idem_test::unique_key("ascii")};
    run_result first = run.run(rq.view(), lease);
    EXPECT_EQ(first.outcome, outcome::won_completed);
    EXPECT_EQ(first.response.status, 201);
    run_result again = run.run(rq.view(), lease);
    EXPECT_TRUE(again.replayed);
    EXPECT_EQ(again.response.body, "{\"id\":\"\xc3\xa9\"}");
    EXPECT_EQ(again.response.header_value("location").value_or(""), location);
    idem_test::test_request other = rq;
    other.body = "{\"amount\":6}";
    run_result mismatch = run.run(other.view(), lease);
    EXPECT_EQ(mismatch.outcome, outcome::conflict);
    EXPECT_EQ(mismatch.response.status, 422);
    EXPECT_EQ(runs, 1);

    int tx_runs = 0;
    auto tx_handler = [&](pg::transaction &tx, const claim_context &) {
        ++tx_runs;
        tx.exec("INSERT INTO effects VALUES ($1, $2)", "k", "\xc3\xa9");
        return response{201, {{"Location", location}}, "paid"};
    };
    for (int mode = 0; mode < 2; ++mode)
    {
        idem_test::test_request t{idem_test::unique_key(mode ? "ascii-intx" : "ascii-fenced")};
        auto go = [&](const idem_test::test_request &r) {
            return mode ? run.run_in_transaction(r.view(), tx_handler)
                        : run.run_fenced(r.view(), tx_handler);
        };
        EXPECT_EQ(go(t).outcome, outcome::won_completed);
        run_result rep = go(t);
        EXPECT_TRUE(rep.replayed);
        EXPECT_EQ(rep.response.header_value("location").value_or(""), location);
        idem_test::test_request o = t;
        o.body = "other";
        EXPECT_EQ(go(o).response.status, 422);
    }
    EXPECT_EQ(tx_runs, 2);
}
