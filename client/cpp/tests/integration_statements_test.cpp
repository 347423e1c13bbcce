// What the runner sends: prepared statements (named or unnamed) and the
// number of round trips per request, counted on the connections
// (pg::connection::round_trips) of a provider that hands out the same
// connections again.
#include "test_support.hpp"

#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;

namespace {

// Keeps its connections and counts the round trips made on them while
// they were lent out.
class counting_pool : public connection_provider
{
public:
    explicit counting_pool(std::string dsn) : dsn_(std::move(dsn)) {}

    connection_handle acquire() override
    {
        std::unique_ptr<pg::connection> c;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (!idle_.empty())
            {
                c = std::move(idle_.back());
                idle_.pop_back();
            }
        }
        if (!c)
            c = std::make_unique<pg::connection>(dsn_);
        const std::uint64_t start = c->round_trips();
        return connection_handle(std::move(c), [this, start](std::unique_ptr<pg::connection> back) {
            std::lock_guard<std::mutex> lk(mu_);
            trips_ += back->round_trips() - start;
            if (back->is_open() && back->status() == pg::transaction_status::idle)
                idle_.push_back(std::move(back));
        });
    }

    // Round trips since the last call.
    std::uint64_t take_trips()
    {
        std::lock_guard<std::mutex> lk(mu_);
        return std::exchange(trips_, 0);
    }
    // Named statements prepared on the idle connections.
    std::size_t prepared() const
    {
        std::lock_guard<std::mutex> lk(mu_);
        std::size_t n = 0;
        for (const auto &c : idle_)
            n += c->prepared_count();
        return n;
    }
    std::size_t idle() const
    {
        std::lock_guard<std::mutex> lk(mu_);
        return idle_.size();
    }
    void each_idle(const std::function<void(pg::connection &)> &f)
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto &c : idle_)
            f(*c);
    }

private:
    std::string dsn_;
    mutable std::mutex mu_;
    std::vector<std::unique_ptr<pg::connection>> idle_;
    std::uint64_t trips_ = 0;
};

config::builder quick()
{
    // A renewal never comes due within these short handlers.
    return idem_test::config_builder().lease(10s).follower_wait_budget(2s).poll(10ms, 100ms);
}

response ok(const claim_context &) { return response{201, {}, "made"}; }

// The runner asks the server once which pg_idem it has: a first request
// pays that round trip; measure after it.
void warm_up(const runner &run)
{
    idem_test::test_request rq{idem_test::unique_key("warm")};
    EXPECT_EQ(run.run(rq.view(), ok).outcome, outcome::won_completed);
}

}  // namespace

TEST(Statements, NamedAreParsedOncePerConnection)
{
    IDEM_REQUIRE_DB();
    counting_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    warm_up(run);
    idem_test::test_request first{idem_test::unique_key("named")};
    pool.take_trips();
    // New key: the claim and the finalize, nothing else.
    EXPECT_EQ(run.run(first.view(), ok).outcome, outcome::won_completed);
    EXPECT_EQ(pool.take_trips(), 2u);
    ASSERT_EQ(pool.idle(), 1u);
    const std::size_t after_first = pool.prepared();
    EXPECT_EQ(after_first, 2u);  // the claim and the finalize
    // Replay: one round trip, nothing parsed again.
    EXPECT_EQ(run.run(first.view(), ok).outcome, outcome::replay);
    EXPECT_EQ(pool.take_trips(), 1u);
    idem_test::test_request second{idem_test::unique_key("named")};
    EXPECT_EQ(run.run(second.view(), ok).outcome, outcome::won_completed);
    EXPECT_EQ(pool.take_trips(), 2u);
    EXPECT_EQ(pool.prepared(), after_first);
    // The server knows them under their names on that session.
    pool.each_idle([&](pg::connection &c) {
        EXPECT_EQ(c.exec("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pg_idem_%'")
                      .get_int(0, 0),
                  static_cast<std::int64_t>(after_first));
    });
}

TEST(Statements, NamedSurviveDiscardAll)
{
    IDEM_REQUIRE_DB();
    counting_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    idem_test::test_request a{idem_test::unique_key("discard")};
    EXPECT_EQ(run.run(a.view(), ok).outcome, outcome::won_completed);
    // What a pooler's server_reset_query does between clients.
    pool.each_idle([](pg::connection &c) { c.exec("DISCARD ALL"); });
    EXPECT_EQ(run.run(a.view(), ok).outcome, outcome::replay);
    idem_test::test_request b{idem_test::unique_key("discard")};
    EXPECT_EQ(run.run(b.view(), ok).outcome, outcome::won_completed);
}

TEST(Statements, UnnamedPrepareNothing)
{
    IDEM_REQUIRE_DB();
    counting_pool pool(idem_test::dsn());
    runner run(pool, quick().pooler_mode(true).build());
    EXPECT_EQ(run.settings().prepared_statements(), pg::preparation::unnamed);
    warm_up(run);
    idem_test::test_request rq{idem_test::unique_key("unnamed")};
    pool.take_trips();
    EXPECT_EQ(run.run(rq.view(), ok).outcome, outcome::won_completed);
    EXPECT_EQ(pool.take_trips(), 2u);
    EXPECT_EQ(run.run(rq.view(), ok).outcome, outcome::replay);
    EXPECT_EQ(pool.take_trips(), 1u);
    EXPECT_EQ(pool.prepared(), 0u);
    pool.each_idle([](pg::connection &c) {
        EXPECT_EQ(c.exec("SELECT count(*) FROM pg_prepared_statements").get_int(0, 0), 0);
    });
}

TEST(Statements, RoundTripsOfTheExactlyOnceModes)
{
    IDEM_REQUIRE_DB();
    counting_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    auto tx_ok = [](pg::transaction &, const claim_context &) { return response{201, {}, "made"}; };
    warm_up(run);
    idem_test::test_request f{idem_test::unique_key("fenced")};
    pool.take_trips();
    EXPECT_EQ(run.run_fenced(f.view(), tx_ok).outcome, outcome::won_completed);
    const std::uint64_t fenced = pool.take_trips();
    idem_test::test_request t{idem_test::unique_key("intx")};
    EXPECT_EQ(run.run_in_transaction(t.view(), tx_ok).outcome, outcome::won_completed);
    const std::uint64_t in_tx = pool.take_trips();
    // fenced: claim; BEGIN, finalize, COMMIT.
    EXPECT_EQ(fenced, 4u);
    // in-transaction, in libpq's pipeline mode: BEGIN + idem_begin
    // (lock_timeout set and restored in the same statement) + SAVEPOINT in
    // one flight, finalize + COMMIT in another (0.4.0: 5 round trips).
    EXPECT_EQ(in_tx, 2u);
    RecordProperty("fenced_round_trips", static_cast<int>(fenced));
    RecordProperty("in_transaction_round_trips", static_cast<int>(in_tx));
    std::printf("round trips: fenced %llu, in-transaction %llu\n",
                static_cast<unsigned long long>(fenced), static_cast<unsigned long long>(in_tx));
}

// ---- pipelines -----------------------------------------------------------------

TEST(Pipeline, BeginStatementsAndCommitInTwoFlights)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    const std::string key = idem_test::unique_key("pipeline");
    const std::uint64_t before = c.round_trips();
    {
        pg::transaction tx(c, pg::isolation::read_committed, pg::defer_begin);
        std::vector<pg::result> rs = tx.exec_pipeline(
            {pg::statement{"SELECT $1::int + 1", {pg::to_param(1)}},
             pg::statement{"INSERT INTO effects (key) VALUES ($1)", {pg::to_param(key)}}},
            pg::preparation::automatic);
        ASSERT_EQ(rs.size(), 2u);
        EXPECT_EQ(rs[0].get_int(0, 0), 2);
        EXPECT_EQ(c.status(), pg::transaction_status::in_transaction);
        rs = tx.commit_with({pg::statement{"INSERT INTO effects (key) VALUES ($1) RETURNING 7",
                                           {pg::to_param(key)}}});
        ASSERT_EQ(rs.size(), 1u);
        EXPECT_EQ(rs[0].get_int(0, 0), 7);
        EXPECT_FALSE(tx.active());
    }
    EXPECT_EQ(c.status(), pg::transaction_status::idle);
    // automatic asked the pid once (its own round trip), then two flights.
    EXPECT_EQ(c.round_trips() - before, 3u);
    EXPECT_EQ(idem_test::count_rows("effects", key), 2);
}

// A statement that fails in the flight with COMMIT: its error, COMMIT not
// run, nothing committed, and the transaction rolls back.
TEST(Pipeline, AFailingStatementKeepsCommitFromRunning)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    const std::string key = idem_test::unique_key("pipeline-fail");
    {
        pg::transaction tx(c, pg::isolation::read_committed, pg::defer_begin);
        tx.exec_pipeline({pg::statement{"INSERT INTO effects (key) VALUES ($1)", {pg::to_param(key)}}});
        EXPECT_THROW(tx.commit_with({pg::statement{"SELECT 1 / 0", {}}}), pg::data_exception);
        EXPECT_TRUE(tx.active());
        EXPECT_EQ(c.status(), pg::transaction_status::in_error);
    }
    EXPECT_EQ(c.status(), pg::transaction_status::idle);
    EXPECT_EQ(idem_test::count_rows("effects", key), 0);
    // A statement that fails in the first flight: the statements after it
    // did not run.
    pg::transaction tx(c, pg::isolation::read_committed, pg::defer_begin);
    EXPECT_THROW(tx.exec_pipeline({pg::statement{"SELECT 1 / 0", {}},
                                   pg::statement{"INSERT INTO effects (key) VALUES ($1)", {pg::to_param(key)}}}),
                 pg::data_exception);
    tx.rollback();
    EXPECT_EQ(idem_test::count_rows("effects", key), 0);
}

// ---- with pg_idem 0.3.0's server-side wait and expiry -------------------

namespace {

// True when the server's idem_claim takes max_wait (0.3.0).
bool server_has_wait()
{
    pg::connection c(idem_test::dsn());
    return c.exec("SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'idem_claim'"
                  " AND pronargs = 4)")
        .get_bool(0, 0);
}

}  // namespace

#define IDEM_REQUIRE_SERVER_WAIT()                                                    \
    do                                                                                \
    {                                                                                 \
        IDEM_REQUIRE_DB();                                                            \
        if (!server_has_wait())                                                       \
            GTEST_SKIP() << "this server's idem_claim has no max_wait (pg_idem 0.2.0)"; \
    } while (0)

// A follower learns the key is in progress, then waits inside its second
// idem_claim and comes back with the replay: no polling.
TEST(ServerWait, FollowersDoNotPoll)
{
    IDEM_REQUIRE_SERVER_WAIT();
    simple_pool winner_pool(idem_test::dsn());
    counting_pool follower_pool(idem_test::dsn());
    runner winner_run(winner_pool, quick().build());
    runner follower_run(follower_pool, quick().follower_wait_budget(60s).build());
    warm_up(follower_run);
    idem_test::test_request rq{idem_test::unique_key("one-call")};
    std::promise<void> entered;
    constexpr int n = 10;
    // The winner finishes once every follower was told "in progress" (the
    // server counts it): no follower can miss the first answer, however
    // slowly the machine starts them.
    const long long seen = idem_test::server_counter("in_progress");
    auto winner = std::async(std::launch::async, [&] {
        return winner_run.run(rq.view(), [&](const claim_context &) {
            entered.set_value();
            idem_test::wait_for_counter("in_progress", seen + n);
            return response{201, {}, "once"};
        });
    });
    entered.get_future().wait();
    follower_pool.take_trips();
    std::vector<std::future<run_result>> fs;
    for (int i = 0; i < n; ++i)
        fs.push_back(std::async(std::launch::async, [&] {
            return follower_run.run(rq.view(), [](const claim_context &) { return response{500, {}, ""}; });
        }));
    EXPECT_EQ(winner.get().outcome, outcome::won_completed);
    for (auto &f : fs)
    {
        run_result r = f.get();
        EXPECT_EQ(r.outcome, outcome::replay);
        EXPECT_EQ(r.response.body, "once");
    }
    // Two idem_claim calls per follower: in_progress, then the waiting one.
    // Behind a pooler (pooler_mode) the waits come in 200 ms slices: the
    // winner's wait takes several, more when its finalize queues in the
    // pooler behind the followers' slices, so the bound there is only a
    // sanity one.
    // (There every slice counts as "in progress", so the winner's wait above
    // may end before a late follower's first call: only the upper bound
    // holds there.)
    const bool pooler = std::getenv("PG_IDEM_TEST_POOLER") != nullptr;
    const std::uint64_t per_follower = pooler ? 8 : 2;
    const std::uint64_t trips = follower_pool.take_trips();
    if (!pooler)
    {
        EXPECT_GE(trips, static_cast<std::uint64_t>(2 * n));
    }
    EXPECT_LE(trips, per_follower * n);
}

// A follower whose budget runs out while the winner still works gets the
// retryable answer after about its budget, from two or three calls.
TEST(ServerWait, BudgetBoundsTheWait)
{
    IDEM_REQUIRE_SERVER_WAIT();
    simple_pool winner_pool(idem_test::dsn());
    counting_pool follower_pool(idem_test::dsn());
    runner winner_run(winner_pool, quick().build());
    runner follower_run(follower_pool, quick().follower_wait_budget(300ms).build());
    warm_up(follower_run);
    idem_test::test_request rq{idem_test::unique_key("budget")};
    std::promise<void> entered, done;
    auto winner = std::async(std::launch::async, [&] {
        return winner_run.run(rq.view(), [&](const claim_context &) {
            entered.set_value();
            done.get_future().wait();
            return response{201, {}, "late"};
        });
    });
    entered.get_future().wait();
    follower_pool.take_trips();
    const auto t0 = std::chrono::steady_clock::now();
    run_result r = follower_run.run(rq.view(), [](const claim_context &) { return response{500, {}, ""}; });
    const auto took = std::chrono::steady_clock::now() - t0;
    done.set_value();
    winner.get();
    EXPECT_EQ(r.outcome, outcome::timeout);
    EXPECT_EQ(r.response.status, 409);
    EXPECT_GE(took, 250ms);
    EXPECT_LT(took, 3s);
    // Behind a pooler the wait is sliced (200 ms): a slice that ends just
    // before the budget costs one more call; the bound is still a handful.
    EXPECT_LE(follower_pool.take_trips(), std::getenv("PG_IDEM_TEST_POOLER") ? 5u : 3u);
}

// Past idem.ttl (1 s here, set for the runner's sessions) a retry is
// refused with 410 Gone, and the handler does not run again.
TEST(ServerWait, ExpiredKeyIsGone)
{
    IDEM_REQUIRE_DB();
    {
        pg::connection c(idem_test::dsn());
        pg::result r = c.exec("SELECT current_setting('idem.after_ttl', true)");
        if (r.is_null(0, 0) || r.get_text(0, 0) != "refuse")
            GTEST_SKIP() << "this server has no idem.after_ttl = 'refuse' (pg_idem 0.2.0)";
    }
    simple_pool pool(idem_test::dsn_with(idem_test::dsn(), "options", "-c idem.ttl=1"));
    runner run(pool, quick().build());
    idem_test::test_request rq{idem_test::unique_key("expired")};
    int runs = 0;
    auto h = [&](const claim_context &) {
        ++runs;
        return response{201, {}, "made"};
    };
    EXPECT_EQ(run.run(rq.view(), h).outcome, outcome::won_completed);
    std::this_thread::sleep_for(2100ms);
    run_result r = run.run(rq.view(), h);
    EXPECT_EQ(r.outcome, outcome::expired);
    EXPECT_EQ(r.response.status, 410);
    EXPECT_EQ(r.response.header_value("content-type").value_or(""), "application/problem+json");
    EXPECT_EQ(runs, 1);
}

// A statement_timeout shorter than the wait cancels the waiting claim: the
// follower polls for the rest of its budget and still replays.
TEST(ServerWait, StatementTimeoutFallsBackToPolling)
{
    IDEM_REQUIRE_SERVER_WAIT();
    simple_pool winner_pool(idem_test::dsn());
    simple_pool follower_pool(idem_test::dsn_with(idem_test::dsn(), "options", "-c statement_timeout=150"));
    runner winner_run(winner_pool, quick().build());
    // A budget far beyond the winner's 600 ms, so that a loaded machine
    // cannot turn the replay into a timeout.
    runner follower_run(follower_pool, quick().follower_wait_budget(30s).build());
    idem_test::test_request rq{idem_test::unique_key("stmt-timeout")};
    std::promise<void> entered;
    auto winner = std::async(std::launch::async, [&] {
        return winner_run.run(rq.view(), [&](const claim_context &) {
            entered.set_value();
            std::this_thread::sleep_for(600ms);
            return response{201, {}, "slow"};
        });
    });
    entered.get_future().wait();
    run_result r = follower_run.run(rq.view(), [](const claim_context &) { return response{500, {}, ""}; });
    EXPECT_EQ(winner.get().outcome, outcome::won_completed);
    EXPECT_EQ(r.outcome, outcome::replay);
    EXPECT_EQ(r.response.body, "slow");
}
