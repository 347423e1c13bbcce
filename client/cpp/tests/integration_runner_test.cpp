// The runner in lease mode against a real server.
#include "test_support.hpp"

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
    return idem_test::config_builder().lease(2s).follower_wait_budget(3s).poll(10ms, 100ms).failure_cooldown(300ms);
}

bool is_replay(const run_result &r)
{
    return r.replayed && r.response.header_value(replay_header_name).value_or("") == "true";
}

}  // namespace

TEST(Runner, ManyThreadsOneKeyRunOnce)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("threads")};
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &claim) {
        runs++;
        EXPECT_TRUE(claim.guarded());
        EXPECT_GT(claim.generation(), 0);
        std::this_thread::sleep_for(300ms);
        return response{201,
                        {{"Content-Type", "application/json"},
                         {"Set-Cookie", "sid=secret"},
                         {"Location", "/orders/1"}},
                        "{\"id\":1}"};
    };
    constexpr int n = 8;
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < n; ++i)
        futures.push_back(std::async(std::launch::async, [&] { return run.run(rq.view(), handler); }));
    int ran = 0, replayed = 0;
    for (auto &f : futures)
    {
        run_result r = f.get();
        EXPECT_EQ(r.response.status, 201);
        EXPECT_EQ(r.response.body, "{\"id\":1}");
        EXPECT_EQ(r.response.header_value("location").value_or(""), "/orders/1");
        if (r.handler_ran)
        {
            ++ran;
            EXPECT_EQ(r.outcome, outcome::won_completed);
            EXPECT_EQ(r.response.header_value("set-cookie").value_or(""), "sid=secret");
        }
        else
        {
            ++replayed;
            EXPECT_TRUE(is_replay(r));
            EXPECT_EQ(r.outcome, outcome::replay);
            EXPECT_FALSE(r.response.header_value("set-cookie").has_value());
        }
    }
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(ran, 1);
    EXPECT_EQ(replayed, n - 1);
    EXPECT_EQ(m.count(outcome::won_completed), 1);
    EXPECT_EQ(m.count(outcome::replay), n - 1);
    EXPECT_EQ(m.total_outcomes(), n);
    EXPECT_EQ(m.count(event::claimed), 1);
    EXPECT_EQ(m.count(event::finalized), 1);
    // A later retry replays too.
    run_result again = run.run(rq.view(), handler);
    EXPECT_TRUE(is_replay(again));
    EXPECT_EQ(runs.load(), 1);
}

TEST(Runner, PollingModeAlsoRunsOnce)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 8);
    runner run(pool, quick().wakeup(follower_wakeup::polling).build());
    req_data rq{idem_test::unique_key("polling")};
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        runs++;
        std::this_thread::sleep_for(200ms);
        return response{200, {}, "ok"};
    };
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < 4; ++i)
        futures.push_back(std::async(std::launch::async, [&] { return run.run(rq.view(), handler); }));
    for (auto &f : futures)
        EXPECT_EQ(f.get().response.body, "ok");
    EXPECT_EQ(runs.load(), 1);
}

TEST(Runner, HandlerLongerThanTheLeaseKeepsItsClaim)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 8);
    idem_test::counting_metrics m;
    // Renewed every 100 ms, a 1 s lease has 900 ms of slack per renewal: a
    // descheduled thread on a loaded machine delays a renewal, never loses it.
    runner run(pool, quick().lease(1000ms).renew_interval(100ms).follower_wait_budget(10s).build(), &m);
    req_data rq{idem_test::unique_key("long")};
    std::atomic<int> runs{0};
    std::promise<void> entered;
    auto handler = [&](const claim_context &claim) {
        if (runs++ == 0)
            entered.set_value();
        std::this_thread::sleep_for(2000ms);  // two leases
        EXPECT_FALSE(claim.lost());
        return response{200, {}, "slow"};
    };
    auto winner = std::async(std::launch::async, [&] { return run.run(rq.view(), handler); });
    entered.get_future().wait();
    auto follower = std::async(std::launch::async, [&] { return run.run(rq.view(), handler); });
    run_result w = winner.get();
    run_result f = follower.get();
    EXPECT_TRUE(w.handler_ran);
    EXPECT_FALSE(w.lease_stolen);
    EXPECT_EQ(w.outcome, outcome::won_completed);
    EXPECT_TRUE(is_replay(f));
    EXPECT_EQ(f.response.body, "slow");
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(m.count(event::recovered_abandoned), 0);
    EXPECT_EQ(m.count(event::lease_stolen), 0);
    EXPECT_EQ(m.count(event::pending_wait), 1);
}

TEST(Runner, AnotherBodyIsAConflictWithoutARun)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner ietf(pool, quick().build(), &m);
    runner seed(pool, quick().profile(status_profile::conflict409).build());
    req_data rq{idem_test::unique_key("mismatch")};
    std::atomic<int> runs{0};
    std::promise<void> entered, release;
    auto release_f = release.get_future().share();
    auto handler = [&](const claim_context &) {
        if (runs++ == 0)
        {
            entered.set_value();
            release_f.wait();
        }
        return response{200, {}, "first"};
    };
    auto first = std::async(std::launch::async, [&] { return ietf.run(rq.view(), handler); });
    entered.get_future().wait();
    // While the first is running: a different body conflicts at once.
    req_data other = rq;
    other.body = "{\"amount\":6}";
    auto t0 = clk::now();
    run_result during = ietf.run(other.view(), handler);
    EXPECT_LT(clk::now() - t0, 1s);
    EXPECT_EQ(during.response.status, 422);
    EXPECT_EQ(during.outcome, outcome::conflict);
    EXPECT_EQ(during.response.header_value("content-type").value_or(""), "application/problem+json");
    release.set_value();
    EXPECT_EQ(first.get().response.body, "first");
    // After it completed, too; and 409 in the seed profile.
    EXPECT_EQ(ietf.run(other.view(), handler).response.status, 422);
    EXPECT_EQ(seed.run(other.view(), handler).response.status, 409);
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(m.count(outcome::conflict), 2);
}

TEST(Runner, ServerErrorCoolsDownThenARetryRunsOnce)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    // 1 s: the longest cooldown whose Retry-After is still "1", so a slow
    // machine has the most time to send the retry within it.
    runner run(pool, quick().failure_cooldown(1000ms).build(), &m);
    req_data rq{idem_test::unique_key("cooldown")};
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        return ++runs == 1 ? response{503, {}, "down"} : response{200, {}, "up"};
    };
    run_result first = run.run(rq.view(), handler);
    EXPECT_EQ(first.response.status, 503);
    EXPECT_EQ(first.response.body, "down");  // the caller gets its own response
    EXPECT_EQ(first.outcome, outcome::failed);
    run_result cooling = run.run(rq.view(), handler);
    EXPECT_EQ(cooling.response.status, 503);
    EXPECT_EQ(cooling.response.header_value("Retry-After").value_or(""), "1");
    EXPECT_FALSE(cooling.handler_ran);
    EXPECT_EQ(m.count(event::retryable_cooldown), 1);
    EXPECT_EQ(runs.load(), 1);
    std::this_thread::sleep_for(1100ms);
    // After the cooldown, concurrent retries: one run.
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < 4; ++i)
        futures.push_back(std::async(std::launch::async, [&] { return run.run(rq.view(), handler); }));
    for (auto &f : futures)
        EXPECT_EQ(f.get().response.body, "up");
    EXPECT_EQ(runs.load(), 2);
    EXPECT_EQ(m.count(event::recovered_abandoned), 1);
    EXPECT_TRUE(is_replay(run.run(rq.view(), handler)));
}

TEST(Runner, HandlerExceptionCoolsDownAndPropagates)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().failure_cooldown(5s).build());
    req_data rq{idem_test::unique_key("throw")};
    EXPECT_THROW(run.run(rq.view(), [](const claim_context &) -> response { throw std::runtime_error("boom"); }),
                 std::runtime_error);
    run_result r = run.run(rq.view(), [](const claim_context &) { return response{200, {}, "x"}; });
    EXPECT_EQ(r.response.status, 503);
    EXPECT_FALSE(r.handler_ran);
}

TEST(Runner, SessionHeadersAreNeverReplayed)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().replay_header("X-Request-Signature").build());
    req_data rq{idem_test::unique_key("headers")};
    auto handler = [](const claim_context &) {
        return response{200,
                        {{"Content-Type", "text/plain"},
                         {"ETag", "\"v1\""},
                         {"Cache-Control", "no-store"},
                         {"Content-Disposition", "attachment; filename=a.pdf"},
                         {"X-Request-Signature", "sig"},
                         {"Set-Cookie", "sid=1"},
                         {"Set-Cookie", "other=2"},
                         {"Authorization", "Bearer t"},
                         {"X-Session-Id", "s"},
                         {"X-Unlisted", "u"}},
                        "body"};
    };
    run_result first = run.run(rq.view(), handler);
    EXPECT_EQ(first.response.headers.size(), 10u);
    run_result replay = run.run(rq.view(), handler);
    ASSERT_TRUE(is_replay(replay));
    const response &r = replay.response;
    EXPECT_EQ(r.header_value("content-type").value_or(""), "text/plain");
    EXPECT_EQ(r.header_value("etag").value_or(""), "\"v1\"");
    EXPECT_EQ(r.header_value("cache-control").value_or(""), "no-store");
    EXPECT_EQ(r.header_value("content-disposition").value_or(""), "attachment; filename=a.pdf");
    EXPECT_EQ(r.header_value("x-request-signature").value_or(""), "sig");
    for (const char *h : {"set-cookie", "authorization", "x-session-id", "x-unlisted"})
        EXPECT_FALSE(r.header_value(h).has_value()) << h;
    EXPECT_EQ(r.headers.size(), 6u);  // five allowed + the replay marker
    // The stored row itself holds no cookie.
    pg::connection c(idem_test::dsn());
    const std::string ck = to_bytes(cache_key(rq.principal, "POST", rq.target, rq.key));
    EXPECT_EQ(c.exec("SELECT count(*) FROM idem_keys WHERE cache_key = $1 AND response_headers ? 'set-cookie'",
                     pg::as_bytea(ck))
                  .get_int(0, 0),
              0);
}

TEST(Runner, OverTheServerCapIsStoredNotReplayable)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn_with(idem_test::dsn(), "options", "-c idem.max_response_bytes=16"));
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("servercap")};
    std::atomic<int> runs{0};
    const std::string big(100, 'b');
    auto handler = [&](const claim_context &) {
        runs++;
        return response{200, {}, big};
    };
    run_result first = run.run(rq.view(), handler);
    EXPECT_EQ(first.response.body, big);  // the caller still gets all of it
    EXPECT_EQ(first.outcome, outcome::completed_uncacheable);
    run_result second = run.run(rq.view(), handler);
    EXPECT_EQ(second.response.status, 409);
    EXPECT_EQ(second.outcome, outcome::conflict);
    EXPECT_NE(second.response.body.find("response-not-replayable"), std::string::npos);
    EXPECT_EQ(runs.load(), 1);
    // A small body is still replayed under that cap.
    req_data small{idem_test::unique_key("servercap-small")};
    run.run(small.view(), [](const claim_context &) { return response{200, {}, "tiny"}; });
    EXPECT_TRUE(is_replay(run.run(small.view(), handler)));
}

TEST(Runner, OverTheClientCapIsStoredNotReplayable)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().max_cacheable_response_bytes(10).build());
    req_data rq{idem_test::unique_key("clientcap")};
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        runs++;
        return response{201, {}, std::string(11, 'c')};
    };
    run_result first = run.run(rq.view(), handler);
    EXPECT_EQ(first.response.body.size(), 11u);
    EXPECT_EQ(first.outcome, outcome::completed_uncacheable);
    EXPECT_EQ(run.run(rq.view(), handler).response.status, 409);
    EXPECT_EQ(runs.load(), 1);
    pg::connection c(idem_test::dsn());
    const std::string ck = to_bytes(cache_key(rq.principal, "POST", rq.target, rq.key));
    pg::result row = c.exec(
        "SELECT state, replayable, response_body IS NULL FROM idem_keys WHERE cache_key = $1",
        pg::as_bytea(ck));
    ASSERT_EQ(row.size(), 1u);
    EXPECT_EQ(row.get_text(0, 0), "completed");
    EXPECT_FALSE(row.get_bool(0, 1));
    EXPECT_TRUE(row.get_bool(0, 2));
}

// The storage rules, but for the validation failures (400, 422): released
// by default (the second request runs), stored and replayed with
// client_errors::store, as in the Python and Node clients.
TEST(Runner, StatusMatrixAgainstTheServer)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    struct row
    {
        int status;
        bool replayed_after;  // a second request replays (otherwise it runs again or cools down)
        bool runs_again;
    };
    for (client_errors how : {client_errors::release, client_errors::store})
    {
        const bool store = how == client_errors::store;
        SCOPED_TRACE(store ? "client_errors::store" : "client_errors::release");
        runner run(pool, quick().failure_cooldown(5s).client_errors(how).build());
        for (const row &r : {row{200, true, false}, row{201, true, false}, row{400, store, !store},
                             row{404, true, false}, row{409, true, false}, row{422, store, !store},
                             row{302, false, true}, row{401, false, true}, row{403, false, true},
                             row{500, false, false}, row{408, false, false}, row{429, false, false}})
        {
            req_data rq{idem_test::unique_key("matrix-" + std::to_string(r.status))};
            int runs = 0;
            auto handler = [&](const claim_context &) {
                runs++;
                return response{r.status, {}, "s" + std::to_string(r.status)};
            };
            EXPECT_EQ(run.run(rq.view(), handler).response.status, r.status);
            run_result second = run.run(rq.view(), handler);
            EXPECT_EQ(is_replay(second), r.replayed_after) << r.status;
            EXPECT_EQ(runs, r.runs_again ? 2 : 1) << r.status;
            if (r.replayed_after)
            {
                EXPECT_EQ(second.response.status, r.status);
            }
            if (!r.replayed_after && !r.runs_again)
            {
                EXPECT_EQ(second.response.status, 503) << r.status;  // cooldown
            }
        }
    }
}

TEST(Runner, KeyValidation)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner run(pool, quick().max_request_body_bytes(64).build(), &m);
    int runs = 0;
    auto handler = [&](const claim_context &claim) {
        runs++;
        EXPECT_FALSE(claim.guarded());
        return response{200, {}, "ok"};
    };
    request_view v;
    v.principal = "alice";
    v.method = "POST";
    v.target = "/x";
    v.body = "b";
    // No key: runs unguarded, every time.
    EXPECT_EQ(run.run(v, handler).outcome, outcome::unguarded);
    EXPECT_EQ(run.run(v, handler).outcome, outcome::unguarded);
    EXPECT_EQ(runs, 2);
    // Required: 400.
    v.key_required = true;
    run_result missing = run.run(v, handler);
    EXPECT_EQ(missing.response.status, 400);
    EXPECT_NE(missing.response.body.find("idempotency-key-missing"), std::string::npos);
    v.key_required = false;
    const std::string long_key(256, 'k');
    const std::string nul_key("a\0b", 3);
    for (const std::vector<std::string_view> &keys :
         std::vector<std::vector<std::string_view>>{{""}, {"a", "a"}, {long_key}, {nul_key}, {"\xc3\x28"}})
    {
        v.idempotency_keys = keys;
        run_result r = run.run(v, handler);
        EXPECT_EQ(r.response.status, 400);
        EXPECT_EQ(r.outcome, outcome::rejected);
    }
    EXPECT_EQ(runs, 2);
    v.idempotency_keys = {"fine"};
    const std::string big(65, 'x');
    v.body = big;
    EXPECT_EQ(run.run(v, handler).response.status, 413);
    EXPECT_EQ(runs, 2);
    EXPECT_EQ(m.count(outcome::rejected), 7);
}

TEST(Runner, FollowerTimesOutWithRetryAfter)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner winner_run(pool, quick().build());
    runner impatient(pool, quick().follower_wait_budget(200ms).build(), &m);
    runner impatient_seed(pool, quick().follower_wait_budget(100ms).profile(status_profile::conflict409).build());
    req_data rq{idem_test::unique_key("timeout")};
    std::promise<void> entered, release;
    auto release_f = release.get_future().share();
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        if (runs++ == 0)
        {
            entered.set_value();
            release_f.wait();
        }
        return response{200, {}, "done"};
    };
    auto winner = std::async(std::launch::async, [&] { return winner_run.run(rq.view(), handler); });
    entered.get_future().wait();
    auto t0 = clk::now();
    run_result r = impatient.run(rq.view(), handler);
    auto waited = clk::now() - t0;
    EXPECT_GE(waited, 190ms);
    EXPECT_LT(waited, 1500ms);
    EXPECT_EQ(r.response.status, 409);
    EXPECT_EQ(r.response.header_value("Retry-After").value_or(""), "1");
    EXPECT_EQ(r.outcome, outcome::timeout);
    EXPECT_EQ(m.count(event::pending_wait), 1);
    EXPECT_EQ(impatient_seed.run(rq.view(), handler).response.status, 503);
    release.set_value();
    EXPECT_EQ(winner.get().response.body, "done");
    EXPECT_EQ(runs.load(), 1);
}

TEST(Runner, VanishedRowIsClaimedAgain)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, quick().build());
    req_data rq{idem_test::unique_key("vanish")};
    std::promise<void> entered;
    std::atomic<int> runs{0};
    auto handler = [&](const claim_context &) {
        if (runs++ == 0)
        {
            entered.set_value();
            std::this_thread::sleep_for(200ms);
            return response{401, {}, "who are you"};  // released: the row goes away
        }
        return response{200, {}, "second"};
    };
    auto first = std::async(std::launch::async, [&] { return run.run(rq.view(), handler); });
    entered.get_future().wait();
    run_result f = run.run(rq.view(), handler);
    EXPECT_EQ(first.get().response.status, 401);
    EXPECT_TRUE(f.handler_ran);
    EXPECT_EQ(f.response.body, "second");
    EXPECT_EQ(runs.load(), 2);
}

TEST(Runner, ConnectionsGoBackClean)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 16);
    runner run(pool, quick().build());
    req_data rq{idem_test::unique_key("clean")};
    auto handler = [&](const claim_context &) {
        std::this_thread::sleep_for(100ms);
        return response{200, {}, "ok"};
    };
    std::vector<std::future<run_result>> futures;
    for (int i = 0; i < 4; ++i)
        futures.push_back(std::async(std::launch::async, [&] { return run.run(rq.view(), handler); }));
    for (auto &f : futures)
        f.get();
    ASSERT_GT(pool.idle(), 0u);
    std::vector<connection_handle> all;
    while (pool.idle() > 0)
        all.push_back(pool.acquire());
    for (auto &c : all)
    {
        EXPECT_EQ(c->status(), pg::transaction_status::idle);
        EXPECT_EQ(c->exec("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
                      .get_int(0, 0),
                  0);
        EXPECT_EQ(c->exec("SELECT current_setting('lock_timeout')").get_text(0, 0), "0");
        // Nothing was SET for the session (only set_config(..., true)).
        EXPECT_EQ(c->exec("SELECT count(*) FROM pg_settings WHERE source = 'session'").get_int(0, 0), 0);
    }
}

TEST(Runner, UnreachableDatabaseIs503)
{
    simple_pool pool("host=/nonexistent-idem-dir port=1 connect_timeout=1");
    runner run(pool, quick().build());
    req_data rq{"k"};
    int runs = 0;
    run_result r = run.run(rq.view(), [&](const claim_context &) {
        runs++;
        return response{};
    });
    EXPECT_EQ(r.response.status, 503);
    EXPECT_EQ(r.outcome, outcome::failed);
    EXPECT_TRUE(r.error);
    EXPECT_EQ(runs, 0);
}

TEST(Runner, RenewalSurvivesALostConnection)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 8);
    idem_test::counting_metrics m;
    // The renewal must reconnect within the lease: 1 s renewed every 100 ms
    // leaves 900 ms for that on a loaded machine.
    runner run(pool, quick().lease(1000ms).renew_interval(100ms).follower_wait_budget(10s).build(), &m);
    req_data rq{idem_test::unique_key("renew-conn")};
    std::atomic<int> runs{0};
    std::promise<void> entered;
    auto handler = [&](const claim_context &claim) {
        if (runs++ == 0)
            entered.set_value();
        std::this_thread::sleep_for(2500ms);
        EXPECT_FALSE(claim.lost());
        return response{200, {}, "kept"};
    };
    auto winner = std::async(std::launch::async, [&] { return run.run(rq.view(), handler); });
    entered.get_future().wait();
    auto follower = std::async(std::launch::async, [&] { return run.run(rq.view(), handler); });
    // Kill the renewal connection: the only session that runs idem_renew
    // (every 100 ms with this lease).
    std::this_thread::sleep_for(250ms);
    pg::connection admin(idem_test::dsn());
    pg::result holder = admin.exec(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query LIKE '%idem_renew(%'");
    ASSERT_EQ(holder.size(), 1u);
    EXPECT_TRUE(admin.exec("SELECT pg_terminate_backend($1::int)", holder.get_int(0, 0)).get_bool(0, 0));
    run_result w = winner.get();
    run_result f = follower.get();
    EXPECT_EQ(w.outcome, outcome::won_completed);
    EXPECT_FALSE(w.lease_stolen);
    EXPECT_TRUE(is_replay(f));
    EXPECT_EQ(f.response.body, "kept");
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(m.count(event::recovered_abandoned), 0);
}

// Followers wake at the finalize's commit, not before: while that commit is
// held up (a deferred trigger on idem_keys waits for advisory lock
// (4242, 3)), the follower keeps waiting (in the server's idem_claim, or
// polling); once it commits, the follower replays the stored response.
TEST(Runner, FollowerIsNotWokenBeforeTheFinalizeCommits)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn(), 8);
    runner run(pool, quick().follower_wait_budget(5s).build());
    req_data rq{idem_test::unique_key("wake-after-commit")};
    const digest ck = cache_key(rq.principal, "POST", rq.target, rq.key);
    pg::connection admin(idem_test::dsn());
    admin.exec("CREATE OR REPLACE FUNCTION gate_finalize() RETURNS trigger LANGUAGE plpgsql AS"
               " $$BEGIN IF NEW.cache_key = '\\x" + to_hex(ck) + "'::bytea AND NEW.state <> 'pending'"
               " THEN PERFORM pg_advisory_xact_lock_shared(4242, 3); END IF; RETURN NULL; END$$");
    admin.exec("CREATE CONSTRAINT TRIGGER idem_keys_finalize_gate AFTER UPDATE ON idem_keys"
               " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION gate_finalize()");
    struct cleanup
    {
        pg::connection &c;
        ~cleanup()
        {
            try
            {
                c.exec("DROP TRIGGER IF EXISTS idem_keys_finalize_gate ON idem_keys");
                c.exec("DROP FUNCTION IF EXISTS gate_finalize()");
            }
            catch (...)
            {
            }
        }
    } drop_gate{admin};
    pg::connection gate(idem_test::dsn());
    gate.exec("SELECT pg_advisory_lock(4242, 3)");

    std::promise<void> entered;
    auto winner = std::async(std::launch::async, [&] {
        return run.run(rq.view(), [&](const claim_context &) {
            entered.set_value();
            std::this_thread::sleep_for(100ms);
            return response{200, {}, "gated"};
        });
    });
    entered.get_future().wait();
    auto follower = std::async(std::launch::async, [&] {
        return run.run(rq.view(), [](const claim_context &) { return response{500, {}, "ran"}; });
    });
    // Wait until the winner's finalize is stuck in its COMMIT.
    bool stuck = false;
    for (int i = 0; i < 300 && !stuck; ++i)
    {
        stuck = !admin.exec("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242"
                            " AND objid = 3 AND NOT granted")
                     .empty();
        if (!stuck)
            std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(stuck);
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(follower.wait_for(0ms), std::future_status::timeout);
    EXPECT_EQ(admin.exec("SELECT state FROM idem_keys WHERE cache_key = $1", pg::as_bytea(to_bytes(ck)))
                  .get_text(0, 0),
              "pending");
    gate.exec("SELECT pg_advisory_unlock(4242, 3)");
    run_result w = winner.get();
    run_result f = follower.get();
    EXPECT_EQ(w.outcome, outcome::won_completed);
    EXPECT_TRUE(is_replay(f));
    EXPECT_EQ(f.response.body, "gated");
    EXPECT_FALSE(f.handler_ran);
}

TEST(Runner, StolenClaimReturnsOwnResponseAndReportsIt)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner run(pool, quick().build(), &m);
    req_data rq{idem_test::unique_key("stolen-lease")};
    const std::string ck = to_bytes(cache_key(rq.principal, "POST", rq.target, rq.key));
    const std::string rh = to_bytes(request_hash(rq.body));
    run_result r = run.run(rq.view(), [&](const claim_context &) {
        // Another worker takes the key over and finishes first.
        pg::connection thief(idem_test::dsn());
        pg::transaction tx(thief);
        tx.exec("UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval '1 second'"
                " WHERE cache_key = $1",
                pg::as_bytea(ck));
        pg::result stolen = tx.exec("SELECT claim_id::text FROM idem_claim($1, $2, '10 seconds')",
                                    pg::as_bytea(ck), pg::as_bytea(rh));
        tx.commit();
        thief.exec("SELECT idem_finalize($1, $2::uuid, 200, NULL, 'theirs'::bytea)", pg::as_bytea(ck),
                   stolen.get_text(0, 0));
        return response{200, {}, "mine"};
    });
    EXPECT_TRUE(r.lease_stolen);
    EXPECT_EQ(r.response.body, "mine");  // the winner's own response
    EXPECT_EQ(m.count(event::lease_stolen), 1);
    EXPECT_EQ(m.count(event::finalized), 0);
    run_result later = run.run(rq.view(), [](const claim_context &) { return response{}; });
    EXPECT_TRUE(is_replay(later));
    EXPECT_EQ(later.response.body, "theirs");  // the stored answer is the new owner's
}
