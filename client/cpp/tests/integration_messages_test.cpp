// The inbox handler and the outbox drainer against a real server.
#include "messages_test_support.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <set>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
using idem_msg_test::count;
using idem_msg_test::dsn;
using idem_msg_test::eventually;
using idem_msg_test::query;

namespace {

long long effects(const std::string &key)
{
    return count("FROM msg_effects WHERE key = $1", key);
}

// The handler most tests use: one effect row, keyed by the message id.
inbox_handler insert_effect(const std::string &key)
{
    return [key](pg::transaction &tx) { tx.exec("INSERT INTO msg_effects (key) VALUES ($1)", key); };
}

std::string inbox_state(const std::string &consumer, const std::string &id)
{
    pg::result r = query("SELECT state FROM idem_inbox WHERE consumer = $1 AND message_id = $2",
                         consumer, id);
    return r.empty() ? std::string("absent") : r.get_text(0, 0);
}

}  // namespace

// ---- inbox --------------------------------------------------------------------

TEST(Inbox, ProcessesOnceThenAnswersDuplicate)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");

    inbox_result first = in.handle("billing", {id, R"({"n":1})"}, insert_effect(id));
    EXPECT_EQ(first.outcome, inbox_outcome::processed);
    EXPECT_TRUE(first.handler_ran);
    EXPECT_EQ(first.handler_runs, 1u);
    EXPECT_EQ(effects(id), 1);
    EXPECT_EQ(inbox_state("billing", id), "done");

    inbox_result again = in.handle("billing", {id, R"({"n":1})"}, insert_effect(id));
    EXPECT_EQ(again.outcome, inbox_outcome::duplicate);
    EXPECT_FALSE(again.handler_ran);
    EXPECT_EQ(effects(id), 1);

    // Another consumer of the same message processes it for itself.
    EXPECT_EQ(in.handle("audit", {id, R"({"n":1})"}, insert_effect(id)).outcome,
              inbox_outcome::processed);
    EXPECT_EQ(effects(id), 2);
    // The connections went back idle and reusable.
    EXPECT_GE(pool.idle(), 1u);
}

TEST(Inbox, HandlerFailureIsRecordedWithRetryAfter)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");

    inbox_result r = in.handle("billing", {id, "p"}, [&](pg::transaction &tx) {
        tx.exec("INSERT INTO msg_effects (key) VALUES ($1)", id);
        throw std::runtime_error("payment provider said no");
    });
    EXPECT_EQ(r.outcome, inbox_outcome::retry);
    EXPECT_EQ(r.error_count, 1);
    EXPECT_EQ(r.retry_after, 1000ms);  // idem.inbox_backoff_base
    ASSERT_TRUE(r.error);
    EXPECT_THROW(std::rethrow_exception(r.error), std::runtime_error);
    EXPECT_EQ(effects(id), 0);  // the handler's write rolled back
    pg::result row = query("SELECT state, error_count, last_error FROM idem_inbox"
                           " WHERE consumer = 'billing' AND message_id = $1",
                           id);
    EXPECT_EQ(row.get_text(0, 0), "failed");
    EXPECT_EQ(row.get_int(0, 1), 1);
    EXPECT_EQ(row.get_text(0, 2), "payment provider said no");

    // The redelivery runs it again and succeeds.
    inbox_result second = in.handle("billing", {id, "p"}, insert_effect(id));
    EXPECT_EQ(second.outcome, inbox_outcome::processed);
    EXPECT_EQ(effects(id), 1);
}

TEST(Inbox, CapMakesTheMessageDeadWithADeadLetter)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox_settings s;
    s.max_attempts = 2;
    inbox in(pool, s);
    const std::string id = idem_test::unique_key("m");
    auto failing = [](pg::transaction &) { throw std::runtime_error("poison"); };

    inbox_result r1 = in.handle("billing", {id, "p"}, failing);
    EXPECT_EQ(r1.outcome, inbox_outcome::retry);
    EXPECT_EQ(r1.error_count, 1);
    inbox_result r2 = in.handle("billing", {id, "p"}, failing);
    EXPECT_EQ(r2.outcome, inbox_outcome::dead);
    EXPECT_EQ(r2.error_count, 2);
    EXPECT_EQ(r2.retry_after, 0ms);
    EXPECT_EQ(count("FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
                    " AND payload ->> 'message_id' = $1 AND payload ->> 'last_error' = 'poison'",
                    id),
              1);

    // A later delivery is answered dead without running the handler.
    inbox_result r3 = in.handle("billing", {id, "p"}, insert_effect(id));
    EXPECT_EQ(r3.outcome, inbox_outcome::dead);
    EXPECT_FALSE(r3.handler_ran);
    EXPECT_EQ(effects(id), 0);
}

TEST(Inbox, SameIdWithAnotherPayloadIsAMismatch)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");
    ASSERT_EQ(in.handle("billing", {id, "first"}, insert_effect(id)).outcome,
              inbox_outcome::processed);
    inbox_result r = in.handle("billing", {id, "second"}, insert_effect(id));
    EXPECT_EQ(r.outcome, inbox_outcome::mismatch);
    EXPECT_FALSE(r.handler_ran);
    EXPECT_EQ(effects(id), 1);
}

TEST(Inbox, ConcurrentDeliveriesHaveOneEffect)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");
    constexpr int threads = 6;
    std::atomic<int> ready{0};
    std::vector<std::future<inbox_result>> results;
    for (int i = 0; i < threads; ++i)
        results.push_back(std::async(std::launch::async, [&] {
            ready.fetch_add(1);
            while (ready.load() < threads)
                std::this_thread::yield();
            return in.handle("billing", {id, "payload"}, [&](pg::transaction &tx) {
                tx.exec("INSERT INTO msg_effects (key) VALUES ($1)", id);
                std::this_thread::sleep_for(50ms);  // keep the others waiting on the message
            });
        }));
    std::map<inbox_outcome, int> outcomes;
    for (auto &f : results)
        outcomes[f.get().outcome]++;
    EXPECT_EQ(outcomes[inbox_outcome::processed], 1);
    EXPECT_EQ(outcomes[inbox_outcome::duplicate], threads - 1);
    EXPECT_EQ(effects(id), 1);
}

TEST(Inbox, SerializationFailureInTheHandlerIsRerunInPlace)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");
    int runs = 0;
    inbox_result r = in.handle("billing", {id, "p"}, [&](pg::transaction &tx) {
        tx.exec("INSERT INTO msg_effects (key, note) VALUES ($1, $2)", id, std::to_string(++runs));
        if (runs == 1)
            tx.exec("DO $$BEGIN RAISE EXCEPTION 'simulated conflict'"
                    " USING ERRCODE = 'serialization_failure'; END$$");
    });
    EXPECT_EQ(r.outcome, inbox_outcome::processed);
    EXPECT_EQ(r.handler_runs, 2u);
    // Only the second run's write committed, and no failure was counted.
    EXPECT_EQ(count("FROM msg_effects WHERE key = $1 AND note = '2'", id), 1);
    EXPECT_EQ(effects(id), 1);
    EXPECT_EQ(query("SELECT error_count FROM idem_inbox WHERE message_id = $1", id).get_int(0, 0), 0);

    // A handler that keeps failing this way is recorded after the last run.
    const std::string id2 = idem_test::unique_key("m");
    inbox_result r2 = in.handle("billing", {id2, "p"}, [&](pg::transaction &tx) {
        tx.exec("DO $$BEGIN RAISE EXCEPTION 'simulated conflict'"
                " USING ERRCODE = 'serialization_failure'; END$$");
    });
    EXPECT_EQ(r2.outcome, inbox_outcome::retry);
    EXPECT_EQ(r2.handler_runs, 3u);
    EXPECT_EQ(r2.error_count, 1);
    EXPECT_THROW(std::rethrow_exception(r2.error), pg::serialization_failure);
}

TEST(Inbox, FailedCommitIsRecordedInAutocommit)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn(), 1);
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");
    const int k = static_cast<int>(std::hash<std::string>{}(id) & 0x3fffffff);
    // A deferred unique constraint: the handler succeeds, COMMIT fails.
    inbox_result r = in.handle("billing", {id, "p"}, [&](pg::transaction &tx) {
        tx.exec("INSERT INTO msg_effects (key) VALUES ($1)", id);
        tx.exec("INSERT INTO msg_deferred VALUES ($1), ($1)", k);
    });
    EXPECT_EQ(r.outcome, inbox_outcome::retry);
    EXPECT_EQ(r.error_count, 1);
    EXPECT_THROW(std::rethrow_exception(r.error), pg::unique_violation);
    EXPECT_EQ(effects(id), 0);
    EXPECT_EQ(inbox_state("billing", id), "failed");

    // The same (pooled) connection works, and nothing holds the message.
    inbox_result again = in.handle("billing", {id, "p"}, insert_effect(id));
    EXPECT_EQ(again.outcome, inbox_outcome::processed);
    EXPECT_EQ(effects(id), 1);
}

TEST(Inbox, LostCommitIsUnknownAndTheHandlerIsNotRerun)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    const std::string id = idem_test::unique_key("m");

    pg::connection gate(dsn());
    gate.exec("SELECT pg_advisory_lock(4243, 1)");
    std::atomic<int> runs{0};
    auto pending = std::async(std::launch::async, [&] {
        return in.handle("billing", {id, "p"}, [&](pg::transaction &tx) {
            runs++;
            tx.exec("INSERT INTO msg_gated (key) VALUES ($1)", id);
        });
    });
    // Its COMMIT waits at the gate: end its session there.
    long long pid = 0;
    ASSERT_TRUE(eventually([&] {
        pg::result w = gate.exec("SELECT pid FROM pg_locks WHERE locktype = 'advisory'"
                                 " AND classid = 4243 AND objid = 1 AND objsubid = 2 AND NOT granted");
        if (!w.empty())
            pid = w.get_int(0, 0);
        return pid != 0;
    }));
    gate.exec("SELECT pg_terminate_backend($1::int)", static_cast<int>(pid));
    inbox_result r = pending.get();
    gate.exec("SELECT pg_advisory_unlock(4243, 1)");

    EXPECT_EQ(r.outcome, inbox_outcome::unknown);
    EXPECT_EQ(runs.load(), 1);
    EXPECT_THROW(std::rethrow_exception(r.error), pg::unknown_outcome);
    // It did not commit: the redelivery processes it (the server counted
    // the lost attempt when the session ended).
    inbox_result again = in.handle("billing", {id, "p"}, insert_effect(id));
    EXPECT_EQ(again.outcome, inbox_outcome::processed);
    EXPECT_EQ(count("FROM msg_gated WHERE key = $1", id), 0);
    EXPECT_EQ(query("SELECT error_count FROM idem_inbox WHERE message_id = $1", id).get_int(0, 0), 1);
}

TEST(Inbox, UnfinishedMessageAtCommitIsInboxUnfinished)
{
    IDEM_REQUIRE_DB();
    const std::string id = idem_test::unique_key("m");
    pg::connection c(dsn());
    pg::transaction tx(c);
    tx.exec("SELECT idem_inbox_begin('billing', $1, sha256('p'), 5)", id);
    try
    {
        tx.commit();
        FAIL() << "COMMIT of an unfinished message succeeded";
    }
    catch (const pg::inbox_unfinished &e)
    {
        EXPECT_EQ(e.sqlstate(), "IL003");
        EXPECT_EQ(e.constraint(), "idem_inbox_message_done");
    }
    // Beginning it again on this session adopts the unaccounted attempt:
    // its failure is written before the new run starts.
    pg::transaction again(c);
    EXPECT_EQ(again.exec("SELECT idem_inbox_begin('billing', $1, sha256('p'), 5)", id).get_text(0, 0),
              "process");
    EXPECT_EQ(again.exec("SELECT error_count FROM idem_inbox WHERE message_id = $1", id).get_text(0, 0),
              "1");
    again.exec("SELECT idem_inbox_done('billing', $1)", id);
    again.commit();
}

TEST(Inbox, BadArgumentsRaiseBeforeTheHandler)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(dsn());
    inbox in(pool);
    bool ran = false;
    EXPECT_THROW(in.handle("", {"m1", "p"}, [&](pg::transaction &) { ran = true; }),
                 pg::invalid_parameter_value);
    EXPECT_THROW(in.handle("billing", {"", "p"}, [&](pg::transaction &) { ran = true; }),
                 pg::invalid_parameter_value);
    EXPECT_FALSE(ran);
    inbox_settings bad;
    bad.max_attempts = 0;
    EXPECT_THROW(inbox(pool, bad), config_error);
}

// ---- outbox -------------------------------------------------------------------

namespace {

// Each outbox test starts from an empty outbox (drainers claim everything).
class Outbox : public ::testing::Test
{
protected:
    void SetUp() override
    {
        if (idem_test::base_dsn().empty())
            GTEST_SKIP() << "PG_IDEM_TEST_DSN is not set: integration test skipped";
        query("DELETE FROM idem_outbox");
    }

    static std::vector<std::int64_t> stage(const std::string &topic, int n,
                                           const std::vector<std::string> &keys)
    {
        std::vector<std::int64_t> ids;
        pg::connection c(dsn());
        pg::transaction tx(c);
        for (int i = 0; i < n; ++i)
        {
            std::optional<std::string> key;
            if (!keys.empty())
                key = keys[static_cast<std::size_t>(i) % keys.size()];
            ids.push_back(tx.exec("SELECT idem_outbox_stage($1, jsonb_build_object('seq', $2::int), $3)",
                                  topic, i, key)
                              .get_int(0, 0));
        }
        tx.commit();
        return ids;
    }
};

struct published_event
{
    std::int64_t id;
    std::optional<std::string> key;
    std::string payload;
};

}  // namespace

TEST_F(Outbox, DrainersPublishEveryEventOnceInPerKeyOrder)
{
    simple_pool pool(dsn(), 8);
    const std::vector<std::string> keys = {"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"};
    std::vector<std::int64_t> staged;
    for (int round = 0; round < 4; ++round)
    {
        auto keyed = stage("orders", 40, keys);
        auto unkeyed = stage("orders", 10, {});
        staged.insert(staged.end(), keyed.begin(), keyed.end());
        staged.insert(staged.end(), unkeyed.begin(), unkeyed.end());
    }

    std::mutex mu;
    std::vector<published_event> log;
    auto publish = [&](const outbox_event &e) {
        if (e.id % 7 == 0)
            std::this_thread::sleep_for(1ms);
        std::lock_guard<std::mutex> lk(mu);
        log.push_back({e.id, e.key, e.payload.value_or("")});
        return publish_result::ok();
    };
    drainer_settings s;
    s.batch = 16;
    s.idle_wait = 200ms;
    std::vector<std::unique_ptr<drainer>> drainers;
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i)
        drainers.push_back(std::make_unique<drainer>(pool, publish, s));
    for (auto &d : drainers)
        threads.emplace_back([&d] { d->run(); });

    const bool all = eventually([&] {
        std::lock_guard<std::mutex> lk(mu);
        return log.size() >= staged.size();
    });
    std::this_thread::sleep_for(50ms);  // a duplicate would show up now
    for (auto &d : drainers)
        d->stop();
    for (auto &t : threads)
        t.join();
    ASSERT_TRUE(all) << "published " << log.size() << " of " << staged.size();

    // Each event once.
    std::set<std::int64_t> seen;
    for (const auto &p : log)
        EXPECT_TRUE(seen.insert(p.id).second) << "event " << p.id << " published twice";
    EXPECT_EQ(seen, std::set<std::int64_t>(staged.begin(), staged.end()));
    // Per key: in id order.
    std::map<std::string, std::int64_t> last;
    for (const auto &p : log)
    {
        if (!p.key)
            continue;
        EXPECT_GT(p.id, last[*p.key]) << "key " << *p.key << " out of order";
        last[*p.key] = p.id;
    }
    batch_report total;
    for (auto &d : drainers)
        total += d->totals();
    EXPECT_EQ(total.acked, staged.size());
    EXPECT_EQ(total.lease_lost, 0u);
    EXPECT_EQ(count("FROM idem_outbox WHERE state = 'published' AND topic = $1", "orders"),
              static_cast<long long>(staged.size()));
}

TEST_F(Outbox, FailingPublisherIsRetriedAfterBackoffThenDead)
{
    // Short backoff and cap for this drainer's session (both USERSET).
    simple_pool pool(idem_test::dsn_with(dsn(), "options",
                                         "-c idem.outbox_backoff=1s -c idem.outbox_max_attempts=3"));
    const auto ids = stage("payments", 1, {});
    std::atomic<int> calls{0};
    drainer d(pool, [&](const outbox_event &e) {
        calls++;
        EXPECT_EQ(e.attempts, calls.load());
        return publish_result::failed("broker down");
    });

    batch_report b1 = d.drain_once();
    EXPECT_EQ(b1.claimed, 1u);
    EXPECT_EQ(b1.retried, 1u);
    EXPECT_EQ(d.drain_once().claimed, 0u);  // backing off
    std::this_thread::sleep_for(1100ms);
    EXPECT_EQ(d.drain_once().retried, 1u);
    std::this_thread::sleep_for(1100ms);
    batch_report b3 = d.drain_once();
    EXPECT_EQ(b3.dead, 1u);
    EXPECT_EQ(calls.load(), 3);
    pg::result row = query("SELECT state, attempts, last_error FROM idem_outbox WHERE id = $1", ids[0]);
    EXPECT_EQ(row.get_text(0, 0), "dead");
    EXPECT_EQ(row.get_int(0, 1), 3);
    EXPECT_EQ(row.get_text(0, 2), "broker down");
    std::this_thread::sleep_for(1100ms);
    EXPECT_EQ(d.drain_once().claimed, 0u);  // dead: never again
}

TEST_F(Outbox, FailedEventHoldsItsKeyUntilItIsPublished)
{
    simple_pool pool(idem_test::dsn_with(dsn(), "options", "-c idem.outbox_backoff=1s"));
    const auto ids = stage("payments", 3, {"acct-1"});
    std::vector<std::int64_t> published;
    bool failed_once = false;
    drainer d(pool, [&](const outbox_event &e) {
        if (!failed_once)
        {
            failed_once = true;
            throw std::runtime_error("timeout talking to the broker");
        }
        published.push_back(e.id);
        return publish_result::ok();
    });
    EXPECT_EQ(d.drain_once().retried, 1u);
    // The later events of the key wait behind the failed one.
    EXPECT_EQ(d.drain_once().claimed, 0u);
    EXPECT_EQ(query("SELECT last_error FROM idem_outbox WHERE id = $1", ids[0]).get_text(0, 0),
              "timeout talking to the broker");
    ASSERT_TRUE(eventually([&] {
        d.drain_once();
        return published.size() == 3;
    }));
    EXPECT_EQ(published, ids);
}

TEST_F(Outbox, StopInterruptsTheIdleWait)
{
    simple_pool pool(dsn());
    drainer_settings s;
    s.idle_wait = 30s;
    drainer d(pool, [](const outbox_event &) { return publish_result::ok(); }, s);
    std::thread t([&] { d.run(); });
    // Inside idem_outbox_wait by now, in a slice with most of its second to go.
    ASSERT_TRUE(eventually([&] {
        return !query("SELECT 1 FROM pg_stat_activity WHERE datname = $1"
                      " AND state = 'active' AND query LIKE '%idem_outbox_wait%' AND pid <> pg_backend_pid()",
                      idem_msg_test::database)
                    .empty();
    }));
    const auto asked = std::chrono::steady_clock::now();
    d.stop();
    t.join();
    // The cancel request ends it, not the end of the slice.
    EXPECT_LT(std::chrono::steady_clock::now() - asked, 600ms);
    EXPECT_TRUE(d.stop_requested());
    // The connection went back to the pool, idle.
    EXPECT_EQ(pool.idle(), 1u);
}

TEST_F(Outbox, StopFinishesTheBatchOrAbandonsTheRest)
{
    for (stop_mode mode : {stop_mode::finish_batch, stop_mode::abandon_rest})
    {
        query("DELETE FROM idem_outbox");
        simple_pool pool(dsn());
        const auto ids = stage("exports", 6, {});
        drainer_settings s;
        s.lease = 2000ms;  // the abandoned rest stays leased while a slow machine looks
        s.on_stop = mode;
        std::atomic<int> published{0};
        drainer *self = nullptr;
        drainer d(pool,
                  [&](const outbox_event &) {
                      if (published.fetch_add(1) == 0)
                          self->stop();  // stop() arrives during the first publish
                      std::this_thread::sleep_for(10ms);
                      return publish_result::ok();
                  },
                  s);
        self = &d;
        d.run();
        batch_report t = d.totals();
        EXPECT_EQ(t.claimed, 6u);
        if (mode == stop_mode::finish_batch)
        {
            EXPECT_EQ(t.acked, 6u);
            EXPECT_EQ(count("FROM idem_outbox WHERE state = 'published' AND topic = $1", "exports"), 6);
        }
        else
        {
            EXPECT_EQ(t.acked, 1u);
            EXPECT_EQ(t.abandoned, 5u);
            // The rest comes back once the lease runs out.
            simple_pool pool2(dsn());
            drainer again(pool2, [](const outbox_event &) { return publish_result::ok(); });
            EXPECT_EQ(again.drain_once().claimed, 0u);
            std::this_thread::sleep_for(2100ms);
            batch_report b = again.drain_once();
            EXPECT_EQ(b.claimed, 5u);
            EXPECT_EQ(b.acked, 5u);
        }
    }
}

TEST_F(Outbox, AckAfterTheLeaseWasTakenOverIsReported)
{
    simple_pool pool(dsn());
    stage("slow", 1, {});
    std::mutex mu;
    std::condition_variable cv;
    bool release = false, entered = false;
    drainer_settings s;
    s.lease = 1500ms;  // a slow claim still leaves the publish time within the lease
    s.lease_margin = 0ms;
    drainer slow(pool,
                 [&](const outbox_event &) {
                     std::unique_lock<std::mutex> lk(mu);
                     entered = true;
                     cv.notify_all();
                     cv.wait(lk, [&] { return release; });
                     return publish_result::ok();
                 },
                 s);
    auto first = std::async(std::launch::async, [&] { return slow.drain_once(); });
    {
        std::unique_lock<std::mutex> lk(mu);
        if (!cv.wait_for(lk, 10s, [&] { return entered; }))
        {
            release = true;
            lk.unlock();
            first.get();
            FAIL() << "the slow drainer never published";
        }
    }
    // The lease runs out while the slow drainer publishes; another takes over.
    std::this_thread::sleep_for(1600ms);
    drainer fast(pool, [](const outbox_event &) { return publish_result::ok(); });
    batch_report b = fast.drain_once();
    EXPECT_EQ(b.claimed, 1u);
    EXPECT_EQ(b.acked, 1u);
    {
        std::lock_guard<std::mutex> lk(mu);
        release = true;
    }
    cv.notify_all();
    batch_report late = first.get();
    EXPECT_EQ(late.published, 1u);
    EXPECT_EQ(late.acked, 0u);
    EXPECT_EQ(late.lease_lost, 1u);
}
