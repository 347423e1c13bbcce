// The store fails after the handler ran: a finalize
// refused by the server, a prepared-statement clash on the finalize (what a
// transaction-mode pooler does to named statements), a backend terminated
// right after the handler. In every mode the handler runs once for the
// key: the runner never releases (or fails) a key whose handler has run
// because storing its result failed; what it cannot store stays pending to
// its lease and the caller is told the outcome is unknown.
#include "test_support.hpp"

#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

using req_data = idem_test::test_request;

// An AFTER UPDATE trigger on idem_keys that refuses to complete the keys
// listed in refuse_finalize: idem_finalize raises P0001 for them, every
// other statement (claim, renew, release, fail, lookup) works.
constexpr const char *refuse_setup[] = {
    "CREATE TABLE IF NOT EXISTS refuse_finalize (cache_key bytea PRIMARY KEY)",
    "CREATE OR REPLACE FUNCTION refuse_finalize() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN IF NEW.state = 'completed' AND EXISTS (SELECT 1 FROM public.refuse_finalize r"
    " WHERE r.cache_key = NEW.cache_key) THEN RAISE EXCEPTION 'finalize refused for this key"
    " (test)'; END IF; RETURN NULL; END $$",
    "DROP TRIGGER IF EXISTS refuse_finalize ON idem_keys",
    "CREATE TRIGGER refuse_finalize AFTER UPDATE ON idem_keys FOR EACH ROW"
    " EXECUTE FUNCTION refuse_finalize()",
};

class StoreErrors : public ::testing::Test
{
protected:
    static void SetUpTestSuite()
    {
        if (idem_test::base_dsn().empty())
            return;
        pg::connection c(idem_test::dsn());
        for (const char *sql : refuse_setup)
            c.exec(sql);
    }
    static void TearDownTestSuite()
    {
        if (idem_test::base_dsn().empty())
            return;
        pg::connection c(idem_test::dsn());
        c.exec("DROP TRIGGER IF EXISTS refuse_finalize ON idem_keys");
        c.exec("DELETE FROM refuse_finalize");
    }

    static void refuse(const req_data &rq, bool on)
    {
        pg::connection c(idem_test::dsn());
        if (on)
            c.exec("INSERT INTO refuse_finalize VALUES ($1)", pg::as_bytea(rq.ck()));
        else
            c.exec("DELETE FROM refuse_finalize WHERE cache_key = $1", pg::as_bytea(rq.ck()));
    }

    // The key's state in idem_keys ("" when there is no row).
    static std::string state(const req_data &rq)
    {
        pg::connection c(idem_test::dsn());
        pg::result r = c.exec("SELECT state FROM idem_keys WHERE cache_key = $1", pg::as_bytea(rq.ck()));
        return r.empty() ? "" : r.get_text(0, 0);
    }

    // Waits (generously) until the key's lease has run out.
    static bool wait_for_lease_expiry(const req_data &rq)
    {
        pg::connection c(idem_test::dsn());
        const auto until = clk::now() + 60s;
        while (clk::now() < until)
        {
            pg::result r = c.exec("SELECT lease_expires_at < clock_timestamp() FROM idem_keys"
                                  " WHERE cache_key = $1",
                                  pg::as_bytea(rq.ck()));
            if (!r.empty() && r.get_bool(0, 0))
                return true;
            std::this_thread::sleep_for(50ms);
        }
        return false;
    }

    static std::string sqlstate_of(const run_result &r)
    {
        if (!r.error)
            return "";
        try
        {
            std::rethrow_exception(r.error);
        }
        catch (const pg::sql_error &e)
        {
            return e.sqlstate();
        }
        catch (...)
        {
            return "?";
        }
    }

    static bool is_outcome_unknown(const run_result &r)
    {
        return r.response.status == 503 &&
               r.response.body.find("outcome-unknown") != std::string::npos &&
               r.response.header_value("Retry-After").has_value();
    }
};

// A provider that remembers the first connection it lent since arm(): the
// claim's connection of the next request.
class recording_pool : public connection_provider
{
public:
    explicit recording_pool(const std::string &dsn) : inner_(dsn, 8) {}
    connection_handle acquire() override
    {
        connection_handle h = inner_.acquire();
        std::lock_guard<std::mutex> lk(mu_);
        if (!first_)
            first_ = &*h;
        return h;
    }
    void arm()
    {
        std::lock_guard<std::mutex> lk(mu_);
        first_ = nullptr;
    }
    pg::connection *first()
    {
        std::lock_guard<std::mutex> lk(mu_);
        return first_;
    }

private:
    simple_pool inner_;
    std::mutex mu_;
    pg::connection *first_ = nullptr;
};

// Makes the next named statements a pg::connection would prepare exist
// already in its server session, as a pooler's other clients leave them:
// its next Parse gets 42P05.
void squat_statement_names(pg::connection &c)
{
    const std::size_t next = c.prepared_count() + 1;
    for (std::size_t n = next; n < next + 4; ++n)
        c.exec("PREPARE pg_idem_" + std::to_string(n) + " AS SELECT 1");
}

// Terminates the backend of c from another session and waits until it is gone.
void terminate(int pid)
{
    pg::connection admin(idem_test::dsn());
    admin.exec("SELECT pg_terminate_backend($1)", pid);
    const auto until = clk::now() + 30s;
    while (clk::now() < until &&
           !admin.exec("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid).empty())
        std::this_thread::sleep_for(5ms);
}

bool behind_pooler() { return std::getenv("PG_IDEM_TEST_POOLER") != nullptr; }

}  // namespace

TEST_F(StoreErrors, LeaseRefusedFinalizeLeavesThePendingKeyToItsLease)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, idem_test::config_builder().lease(6s).follower_wait_budget(300ms).build(), &m);
    req_data rq{idem_test::unique_key("refused-lease")};
    refuse(rq, true);
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        runs++;
        return response{201, {}, "charged"};
    };
    run_result r = run.run(rq.view(), handler);
    EXPECT_TRUE(r.handler_ran);
    EXPECT_TRUE(r.outcome_unknown);
    EXPECT_EQ(r.outcome, outcome::failed);
    EXPECT_TRUE(is_outcome_unknown(r)) << r.response.status << " " << r.response.body;
    EXPECT_EQ(sqlstate_of(r), "P0001");
    EXPECT_GE(m.count(event::finalize_error), 1);
    EXPECT_EQ(state(rq), "pending");  // never released, never failed

    // Duplicates within the lease: none runs the handler.
    std::vector<std::future<run_result>> dups;
    for (int i = 0; i < 6; ++i)
        dups.push_back(std::async(std::launch::async, [&] { return run.run(rq.view(), handler); }));
    for (auto &f : dups)
    {
        run_result d = f.get();
        EXPECT_FALSE(d.handler_ran);
        EXPECT_NE(d.response.status, 201);
    }
    EXPECT_EQ(runs.load(), 1);

    // Once the lease is over the same request recovers the key, once.
    refuse(rq, false);
    ASSERT_TRUE(wait_for_lease_expiry(rq));
    run_result again = run.run(rq.view(), handler);
    EXPECT_EQ(again.response.status, 201);
    EXPECT_EQ(again.outcome, outcome::won_completed);
    EXPECT_EQ(runs.load(), 2);
    EXPECT_TRUE(run.run(rq.view(), handler).replayed);
    EXPECT_EQ(runs.load(), 2);
}

TEST_F(StoreErrors, LeasePreparedStatementClashOnFinalizeIsStoredUnnamed)
{
    IDEM_REQUIRE_DB();
    if (behind_pooler())
        GTEST_SKIP() << "needs the claim's own server session";
    recording_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner run(pool,
               idem_test::config_builder().lease(10s).follower_wait_budget(2s)
                   .prepared_statements(pg::preparation::named).build(),
               &m);
    // A first request prepares the runner's statements on the connection.
    req_data warm{idem_test::unique_key("clash-warm")};
    EXPECT_EQ(run.run(warm.view(), [](const claim_context &) { return response{201, {}, "w"}; })
                  .outcome,
              outcome::won_completed);
    req_data rq{idem_test::unique_key("clash-lease")};
    std::atomic<int> runs{0};
    pool.arm();
    auto handler = [&](const claim_context &) {
        if (runs++ == 0)
        {
            pg::connection *claim_conn = pool.first();
            EXPECT_NE(claim_conn, nullptr);
            if (claim_conn)
            {
                // A fresh statement cache on the same server session, as a
                // pooler hands a client another client's session.
                claim_conn->exec("DEALLOCATE ALL");
                squat_statement_names(*claim_conn);
            }
        }
        return response{201, {}, "charged"};
    };
    run_result r = run.run(rq.view(), handler);
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(r.response.body, "charged");
    EXPECT_EQ(r.outcome, outcome::won_completed);
    EXPECT_FALSE(r.outcome_unknown);
    EXPECT_GE(m.count(event::finalize_error), 1);  // the clash did happen
    EXPECT_EQ(state(rq), "completed");
    for (int i = 0; i < 5; ++i)
    {
        run_result d = run.run(rq.view(), handler);
        EXPECT_TRUE(d.replayed);
        EXPECT_EQ(d.response.body, "charged");
    }
    EXPECT_EQ(runs.load(), 1);
}

TEST_F(StoreErrors, LeaseBackendTerminatedAfterTheHandlerIsStoredOnAFreshConnection)
{
    IDEM_REQUIRE_DB();
    if (behind_pooler())
        GTEST_SKIP() << "needs the claim's own server session";
    recording_pool pool(idem_test::dsn());
    runner run(pool, idem_test::config_builder().lease(10s).follower_wait_budget(2s).build());
    req_data rq{idem_test::unique_key("terminated-lease")};
    std::atomic<int> runs{0};
    pool.arm();
    auto handler = [&](const claim_context &) {
        if (runs++ == 0 && pool.first())
            terminate(pool.first()->backend_pid());
        return response{201, {}, "charged"};
    };
    run_result r = run.run(rq.view(), handler);
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(r.outcome, outcome::won_completed);
    for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(run.run(rq.view(), handler).replayed);
    EXPECT_EQ(runs.load(), 1);
}

TEST_F(StoreErrors, FencedRefusedFinalizeIsAnsweredAndLeavesThePendingKey)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, idem_test::config_builder().lease(6s).follower_wait_budget(300ms)
                         .failure_cooldown(100ms).build());
    req_data rq{idem_test::unique_key("refused-fenced")};
    refuse(rq, true);
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        return response{201, {}, "paid"};
    };
    run_result r;
    EXPECT_NO_THROW(r = run.run_fenced(rq.view(), handler));
    EXPECT_TRUE(r.handler_ran);
    EXPECT_TRUE(r.outcome_unknown);
    EXPECT_TRUE(is_outcome_unknown(r)) << r.response.status << " " << r.response.body;
    EXPECT_EQ(sqlstate_of(r), "P0001");
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
    EXPECT_EQ(state(rq), "pending");
    // Longer than the cooldown a failed key would have had.
    std::this_thread::sleep_for(300ms);
    for (int i = 0; i < 4; ++i)
    {
        run_result d = run.run_fenced(rq.view(), handler);
        EXPECT_FALSE(d.handler_ran);
    }
    EXPECT_EQ(runs.load(), 1);
    refuse(rq, false);
    ASSERT_TRUE(wait_for_lease_expiry(rq));
    EXPECT_EQ(run.run_fenced(rq.view(), handler).response.status, 201);
    EXPECT_EQ(runs.load(), 2);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 1);
}

TEST_F(StoreErrors, FencedPreparedStatementClashCannotAbortTheHandlersTransaction)
{
    IDEM_REQUIRE_DB();
    if (behind_pooler())
        GTEST_SKIP() << "needs the transaction's own server session";
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, idem_test::config_builder().lease(10s).follower_wait_budget(2s)
                         .failure_cooldown(100ms)
                         .prepared_statements(pg::preparation::named).build());
    req_data rq{idem_test::unique_key("clash-fenced")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        tx.exec("DEALLOCATE ALL");
        squat_statement_names(tx.conn());
        return response{201, {}, "paid"};
    };
    run_result r;
    EXPECT_NO_THROW(r = run.run_fenced(rq.view(), handler));
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(r.outcome, outcome::won_completed);
    // Duplicates on other connections (the squatted session went back to
    // the pool), past the cooldown a failure would have left.
    std::this_thread::sleep_for(300ms);
    simple_pool other_pool(idem_test::dsn(), 4);
    runner other(other_pool, idem_test::config_builder().follower_wait_budget(2s).build());
    for (int i = 0; i < 4; ++i)
        EXPECT_TRUE(other.run_fenced(rq.view(), handler).replayed);
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 1);
}

TEST_F(StoreErrors, FencedBackendTerminatedAfterTheHandlerIsNotRerun)
{
    IDEM_REQUIRE_DB();
    if (behind_pooler())
        GTEST_SKIP() << "needs the transaction's own server session";
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, idem_test::config_builder().lease(6s).follower_wait_budget(300ms).build());
    req_data rq{idem_test::unique_key("terminated-fenced")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        terminate(tx.conn().backend_pid());
        return response{201, {}, "paid"};
    };
    run_result r;
    EXPECT_NO_THROW(r = run.run_fenced(rq.view(), handler));
    EXPECT_EQ(runs.load(), 1);
    EXPECT_TRUE(is_outcome_unknown(r)) << r.response.status << " " << r.response.body;
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
    EXPECT_EQ(state(rq), "pending");
    for (int i = 0; i < 3; ++i)
        EXPECT_FALSE(run.run_fenced(rq.view(), handler).handler_ran);
    EXPECT_EQ(runs.load(), 1);
}

TEST_F(StoreErrors, InTransactionRefusedFinalizeIsAnsweredWithACooldown)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, idem_test::config_builder().lease(6s).follower_wait_budget(300ms)
                         .failure_cooldown(5s).build());
    req_data rq{idem_test::unique_key("refused-intx")};
    refuse(rq, true);
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        return response{201, {}, "paid"};
    };
    run_result r;
    EXPECT_NO_THROW(r = run.run_in_transaction(rq.view(), handler));
    EXPECT_TRUE(r.handler_ran);
    EXPECT_EQ(r.outcome, outcome::failed);
    EXPECT_TRUE(is_outcome_unknown(r)) << r.response.status << " " << r.response.body;
    EXPECT_EQ(sqlstate_of(r), "P0001");
    EXPECT_EQ(runs.load(), 1);
    // Everything rolled back together, but the cooldown: a duplicate does not run.
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
    EXPECT_EQ(state(rq), "failed");
    for (int i = 0; i < 3; ++i)
        EXPECT_FALSE(run.run_in_transaction(rq.view(), handler).handler_ran);
    EXPECT_EQ(runs.load(), 1);
}

TEST_F(StoreErrors, InTransactionBackendTerminatedAfterTheHandlerIsNotRerunInTheCall)
{
    IDEM_REQUIRE_DB();
    if (behind_pooler())
        GTEST_SKIP() << "needs the transaction's own server session";
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, idem_test::config_builder().lease(6s).follower_wait_budget(300ms).build());
    req_data rq{idem_test::unique_key("terminated-intx")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        terminate(tx.conn().backend_pid());
        return response{201, {}, "paid"};
    };
    run_result r;
    EXPECT_NO_THROW(r = run.run_in_transaction(rq.view(), handler));
    EXPECT_EQ(runs.load(), 1);
    EXPECT_TRUE(r.handler_ran);
    EXPECT_TRUE(is_outcome_unknown(r)) << r.response.status << " " << r.response.body;
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
}
