// Exactly-once modes (fenced, in-transaction) and commits whose outcome is
// unknown because the connection died while COMMIT was in flight.
#include "test_support.hpp"

#include <libpq-fe.h>
#include <sys/socket.h>

#include <future>
#include <thread>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

using req_data = idem_test::test_request;

config::builder quick()
{
    return idem_test::config_builder().lease(2s).follower_wait_budget(5s).poll(10ms, 100ms).failure_cooldown(300ms);
}

// Blocks COMMITs of gated_effects inserts while alive (see test_support.cpp).
class commit_gate
{
public:
    commit_gate() : c_(idem_test::dsn()) { c_.exec("SELECT pg_advisory_lock(4242, 1)"); }
    ~commit_gate() { open(); }
    void open()
    {
        if (held_)
            c_.exec("SELECT pg_advisory_unlock(4242, 1)");
        held_ = false;
    }
    // The backend stuck at the gate (its COMMIT in flight).
    int wait_for_waiter()
    {
        const auto until = clk::now() + 10s;
        while (clk::now() < until)
        {
            pg::result r = c_.exec(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242"
                " AND objid = 1 AND objsubid = 2 AND NOT granted");
            if (!r.empty())
                return static_cast<int>(r.get_int(0, 0));
            std::this_thread::sleep_for(5ms);
        }
        return 0;
    }
    pg::connection &conn() { return c_; }

private:
    pg::connection c_;
    bool held_ = true;
};

}  // namespace

TEST(Fenced, CommitsHandlerWritesWithTheResponse)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("fenced")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &claim) {
        runs++;
        tx.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, 'fenced')", rq.key,
                claim.generation());
        std::this_thread::sleep_for(150ms);
        return response{201, {{"Content-Type", "text/plain"}}, "transferred"};
    };
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < 5; ++i)
        futures.push_back(std::async(std::launch::async, [&] { return run.run_fenced(rq.view(), handler); }));
    std::int64_t generation = 0;
    for (auto &f : futures)
    {
        run_result r = f.get();
        EXPECT_EQ(r.response.status, 201);
        EXPECT_EQ(r.response.body, "transferred");
        if (r.handler_ran)
            generation = r.generation;
    }
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 1);
    pg::connection c(idem_test::dsn());
    EXPECT_EQ(c.exec("SELECT generation FROM effects WHERE key = $1", rq.key).get_int(0, 0), generation);
    EXPECT_EQ(m.count(outcome::won_completed), 1);
    EXPECT_EQ(m.count(outcome::replay), 4);
}

TEST(Fenced, StolenLeaseRollsTheDomainWriteBack)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("stolen")};
    int runs = 0;
    auto handler = [&](pg::transaction &tx, const claim_context &claim) {
        runs++;
        tx.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, 'victim')", rq.key,
                claim.generation());
        // Another worker decides the lease expired, takes the key over and
        // stores its own answer while this handler is still running.
        pg::connection thief(idem_test::dsn());
        pg::transaction ttx(thief);
        ttx.exec("UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval '1 second'"
                 " WHERE cache_key = $1",
                 pg::as_bytea(rq.ck()));
        pg::result stolen = ttx.exec("SELECT outcome, claim_id::text, generation FROM idem_claim($1, $2, '10 seconds')",
                                     pg::as_bytea(rq.ck()), pg::as_bytea(rq.rh()));
        ttx.commit();
        EXPECT_EQ(stolen.get_text(0, 0), "recovered_abandoned");
        EXPECT_GT(stolen.get_int(0, 2), claim.generation());
        EXPECT_TRUE(thief.exec("SELECT idem_finalize($1, $2::uuid, 201, '{\"content-type\":\"text/plain\"}', 'thief'::bytea)",
                               pg::as_bytea(rq.ck()), stolen.get_text(0, 1))
                        .get_bool(0, 0));
        return response{200, {}, "victim"};
    };
    run_result r = run.run_fenced(rq.view(), handler);
    EXPECT_TRUE(r.handler_ran);
    EXPECT_TRUE(r.lease_stolen);
    EXPECT_TRUE(r.replayed);
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(r.response.body, "thief");
    EXPECT_EQ(runs, 1);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);  // the domain insert rolled back
    EXPECT_EQ(m.count(event::lease_stolen), 1);
    EXPECT_EQ(m.count(outcome::replay), 1);
}

TEST(Fenced, ServerErrorRollsBackAndCoolsDown)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().failure_cooldown(5s).build());
    req_data rq{idem_test::unique_key("fenced-500")};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        return response{500, {}, "oops"};
    };
    EXPECT_EQ(run.run_fenced(rq.view(), handler).response.status, 500);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
    run_result again = run.run_fenced(rq.view(), handler);
    EXPECT_EQ(again.response.status, 503);
    EXPECT_FALSE(again.handler_ran);
}

TEST(Fenced, SerializationFailureRerunsTheTransaction)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().transaction_attempts(3).build());
    req_data rq{idem_test::unique_key("fenced-40001")};
    pg::connection setup(idem_test::dsn());
    setup.exec("INSERT INTO counters VALUES (2, 0) ON CONFLICT (id) DO UPDATE SET n = 0");
    int runs = 0;
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        ++runs;
        const auto n = tx.exec("SELECT n FROM counters WHERE id = 2").get_int(0, 0);
        if (runs == 1)
        {
            pg::connection other(idem_test::dsn());
            other.exec("UPDATE counters SET n = n + 10 WHERE id = 2");
        }
        tx.exec("UPDATE counters SET n = $1 WHERE id = 2", n + 1);
        return response{200, {}, std::to_string(n + 1)};
    };
    run_result r = run.run_fenced(rq.view(), handler, pg::isolation::repeatable_read);
    EXPECT_EQ(runs, 2);
    EXPECT_EQ(r.response.body, "11");
    EXPECT_EQ(setup.exec("SELECT n FROM counters WHERE id = 2").get_int(0, 0), 11);
}

TEST(UnknownOutcome, TerminatedDuringCommitIsResolvedWithoutASecondRun)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("terminated")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        tx.exec("INSERT INTO gated_effects(key) VALUES ($1)", rq.key);
        return response{201, {}, "paid"};
    };
    run_result r;
    {
        commit_gate gate;
        auto fut = std::async(std::launch::async, [&] { return run.run_fenced(rq.view(), handler); });
        const int pid = gate.wait_for_waiter();
        ASSERT_NE(pid, 0) << "the COMMIT never reached the gate";
        EXPECT_TRUE(gate.conn().exec("SELECT pg_terminate_backend($1)", pid).get_bool(0, 0));
        gate.open();
        r = fut.get();
    }
    // The transaction died before its commit record: nothing happened, and
    // the runner says so without running the handler again.
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(idem_test::count_rows("gated_effects", rq.key), 0);
    EXPECT_EQ(r.response.status, 503);
    EXPECT_NE(r.response.body.find("outcome-unknown"), std::string::npos);
    EXPECT_TRUE(r.response.header_value("Retry-After").has_value());
    EXPECT_EQ(m.count(event::unknown_outcome), 1);
    // The client's retry runs it once; the next one replays.
    run_result retry = run.run_fenced(rq.view(), handler);
    EXPECT_EQ(retry.response.status, 201);
    EXPECT_EQ(runs.load(), 2);
    EXPECT_EQ(idem_test::count_rows("gated_effects", rq.key), 1);
    EXPECT_TRUE(run.run_fenced(rq.view(), handler).replayed);
    EXPECT_EQ(runs.load(), 2);
}

TEST(UnknownOutcome, ConnectionLostAfterACommitIsResolvedAsDone)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("lost-ack")};
    std::atomic<int> runs{0};
    std::atomic<int> fd{-1};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        runs++;
        fd = PQsocket(tx.conn().native_handle());
        tx.exec("INSERT INTO gated_effects(key) VALUES ($1)", rq.key);
        return response{201, {}, "paid"};
    };
    run_result r;
    {
        commit_gate gate;
        auto fut = std::async(std::launch::async, [&] { return run.run_fenced(rq.view(), handler); });
        ASSERT_NE(gate.wait_for_waiter(), 0);
        // The client loses its socket while the server is inside COMMIT;
        // the server goes on and commits.
        ::shutdown(fd.load(), SHUT_RDWR);
        std::this_thread::sleep_for(300ms);
        gate.open();
        r = fut.get();
    }
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(idem_test::count_rows("gated_effects", rq.key), 1);
    EXPECT_EQ(r.response.status, 201);
    EXPECT_EQ(r.response.body, "paid");
    EXPECT_FALSE(r.outcome_unknown);
    EXPECT_EQ(r.outcome, outcome::won_completed);
    EXPECT_EQ(m.count(event::unknown_outcome), 1);
    run_result again = run.run_fenced(rq.view(), handler);
    EXPECT_TRUE(again.replayed);
    EXPECT_EQ(again.response.body, "paid");
    EXPECT_EQ(runs.load(), 1);
}

TEST(InTransaction, ConcurrentDuplicatesHaveOneEffect)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("intx")};
    std::atomic<int> runs{0};
    auto handler = [&](pg::transaction &tx, const claim_context &claim) {
        runs++;
        EXPECT_GT(claim.generation(), 0);
        tx.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, 'intx')", rq.key,
                claim.generation());
        std::this_thread::sleep_for(200ms);
        return response{201, {{"Content-Type", "text/plain"}}, "booked"};
    };
    constexpr int n = 6;
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < n; ++i)
        futures.push_back(
            std::async(std::launch::async, [&] { return run.run_in_transaction(rq.view(), handler); }));
    int replayed = 0;
    for (auto &f : futures)
    {
        run_result r = f.get();
        EXPECT_EQ(r.response.status, 201);
        EXPECT_EQ(r.response.body, "booked");
        replayed += r.replayed;
    }
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(replayed, n - 1);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 1);
    EXPECT_EQ(m.count(outcome::won_completed), 1);
}

TEST(InTransaction, FailureKeepsNoWritesButACooldown)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().failure_cooldown(5s).build());
    req_data rq{idem_test::unique_key("intx-500")};
    auto handler = [&](pg::transaction &tx, const claim_context &) {
        tx.exec("INSERT INTO effects(key) VALUES ($1)", rq.key);
        return response{502, {}, "upstream"};
    };
    EXPECT_EQ(run.run_in_transaction(rq.view(), handler).response.status, 502);
    EXPECT_EQ(idem_test::count_rows("effects", rq.key), 0);
    run_result again = run.run_in_transaction(rq.view(), handler);
    EXPECT_EQ(again.response.status, 503);
    EXPECT_FALSE(again.handler_ran);
    // A thrown handler: the same.
    req_data rq2{idem_test::unique_key("intx-throw")};
    EXPECT_THROW(run.run_in_transaction(rq2.view(),
                                        [&](pg::transaction &tx, const claim_context &) -> response {
                                            tx.exec("INSERT INTO effects(key) VALUES ($1)", rq2.key);
                                            throw std::runtime_error("handler bug");
                                        }),
                 std::runtime_error);
    EXPECT_EQ(idem_test::count_rows("effects", rq2.key), 0);
    EXPECT_EQ(run.run_in_transaction(rq2.view(), handler).response.status, 503);
}

TEST(InTransaction, DuplicateWaitIsBoundedByTheBudget)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner slow(pool, quick().build());
    runner impatient(pool, quick().follower_wait_budget(300ms).build());
    req_data rq{idem_test::unique_key("intx-wait")};
    std::promise<void> entered, release;
    auto release_f = release.get_future().share();
    auto first = std::async(std::launch::async, [&] {
        return slow.run_in_transaction(rq.view(), [&](pg::transaction &, const claim_context &) {
            entered.set_value();
            release_f.wait();
            return response{200, {}, "first"};
        });
    });
    entered.get_future().wait();
    auto t0 = clk::now();
    run_result r = impatient.run_in_transaction(rq.view(), [](pg::transaction &, const claim_context &) {
        ADD_FAILURE() << "duplicate ran";
        return response{};
    });
    EXPECT_LT(clk::now() - t0, 2s);
    EXPECT_EQ(r.response.status, 409);
    EXPECT_EQ(r.outcome, outcome::timeout);
    // A lease-mode claim of a key held by idem_begin is bounded too.
    run_result lease_mode = impatient.run(rq.view(), [](const claim_context &) {
        ADD_FAILURE() << "duplicate ran";
        return response{};
    });
    EXPECT_EQ(lease_mode.response.status, 409);
    release.set_value();
    EXPECT_EQ(first.get().response.body, "first");
    EXPECT_TRUE(impatient.run_in_transaction(rq.view(), [](pg::transaction &, const claim_context &) {
                             return response{};
                         }).replayed);
}

TEST(Unguarded, TransactionModesRunWithoutAKey)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    request_view v;
    v.principal = "p";
    v.method = "POST";
    v.target = "/";
    const std::string key = idem_test::unique_key("nokey");
    auto handler = [&](pg::transaction &tx, const claim_context &claim) {
        EXPECT_FALSE(claim.guarded());
        tx.exec("INSERT INTO effects(key) VALUES ($1)", key);
        return response{200, {}, "ok"};
    };
    EXPECT_EQ(run.run_fenced(v, handler).outcome, outcome::unguarded);
    EXPECT_EQ(run.run_in_transaction(v, handler).outcome, outcome::unguarded);
    EXPECT_EQ(idem_test::count_rows("effects", key), 2);
}
