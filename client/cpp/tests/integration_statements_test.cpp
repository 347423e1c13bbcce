// What the runner sends: prepared statements (named or unnamed) and the
// number of round trips per request, counted on the connections
// (pg::connection::round_trips) of a provider that hands out the same
// connections again.
#include "test_support.hpp"

#include <memory>
#include <mutex>
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
    return config::builder().lease(10s).follower_wait_budget(2s).poll(10ms, 100ms);
}

response ok(const claim_context &) { return response{201, {}, "made"}; }

}  // namespace

TEST(Statements, NamedAreParsedOncePerConnection)
{
    IDEM_REQUIRE_DB();
    counting_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    idem_test::test_request first{idem_test::unique_key("named")};
    pool.take_trips();
    // New key: the claim and the finalize, nothing else.
    EXPECT_EQ(run.run(first.view(), ok).outcome, outcome::won_completed);
    EXPECT_EQ(pool.take_trips(), 2u);
    ASSERT_EQ(pool.idle(), 1u);
    const std::size_t after_first = pool.prepared();
    EXPECT_GE(after_first, 2u);  // claim and finalize (and any setup)
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
    idem_test::test_request f{idem_test::unique_key("fenced")};
    pool.take_trips();
    EXPECT_EQ(run.run_fenced(f.view(), tx_ok).outcome, outcome::won_completed);
    const std::uint64_t fenced = pool.take_trips();
    idem_test::test_request t{idem_test::unique_key("intx")};
    EXPECT_EQ(run.run_in_transaction(t.view(), tx_ok).outcome, outcome::won_completed);
    const std::uint64_t in_tx = pool.take_trips();
    // fenced: claim; BEGIN, finalize, COMMIT.
    EXPECT_LE(fenced, 5u);
    // in-transaction: BEGIN, idem_begin, SAVEPOINT, finalize, COMMIT.
    EXPECT_LE(in_tx, 7u);
    RecordProperty("fenced_round_trips", static_cast<int>(fenced));
    RecordProperty("in_transaction_round_trips", static_cast<int>(in_tx));
    std::printf("round trips: fenced %llu, in-transaction %llu\n",
                static_cast<unsigned long long>(fenced), static_cast<unsigned long long>(in_tx));
}
