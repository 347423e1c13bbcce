// Partition routing against a PL/Proxy router and its partitions
// (tests/scaleout): the C++ hash and map agree with the router's on many
// keys, lease mode runs through the router, and fenced and in-transaction
// modes run on the partition that owns the key, with the handler's writes.
//
// PG_IDEM_SCALEOUT_ROUTER is the router's conninfo; the scaleout suite sets
// it. Without it only the tests that need no server run (the hash and the
// mapping), so that ctest counts what really ran.
#include <idem/diagnostics.hpp>
#include <idem/partition.hpp>
#include <idem/runner.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>

using namespace idem;
using namespace std::chrono_literals;

namespace {

std::string router_dsn()
{
    const char *v = std::getenv("PG_IDEM_SCALEOUT_ROUTER");
    return v ? v : "";
}

// A request whose key no earlier run used.
struct req_data
{
    std::string key;
    std::string body = "{\"amount\":7}";
    request_view view() const
    {
        request_view v;
        v.principal = "alice";
        v.method = "POST";
        v.target = "/payments";
        v.idempotency_keys = {key};
        v.body = body;
        return v;
    }
    std::string ck() const { return to_bytes(cache_key("alice", "POST", "/payments", key)); }
};

std::string unique_key(const std::string &prefix)
{
    static std::mt19937_64 rng(std::random_device{}());
    return prefix + "-" + std::to_string(rng());
}

config quick() { return config::builder().lease(5s).follower_wait_budget(2s).build(); }

// Rows of label in routed_payments on partition i.
long long rows_on(partitioned_pool &pools, std::size_t i, const std::string &label)
{
    auto c = pools.partition(i).acquire();
    return c->exec("SELECT count(*) FROM routed_payments WHERE label = $1", label).get_int(0, 0);
}

class Scaleout : public ::testing::Test
{
protected:
    static void SetUpTestSuite()
    {
        pools_ = new partitioned_pool(partitioned_pool::from_router(router_dsn()));
        for (std::size_t i = 0; i < pools_->map().size(); ++i)
        {
            auto c = pools_->partition(i).acquire();
            c->exec("CREATE TABLE IF NOT EXISTS routed_payments (label text, generation bigint)");
        }
    }
    static void TearDownTestSuite() { delete pools_; }
    static partitioned_pool *pools_;
};
partitioned_pool *Scaleout::pools_ = nullptr;

}  // namespace

TEST(PartitionHash, FirstFourBytesBigEndianSigned)
{
    EXPECT_EQ(partition_hash(std::string("\x01\x02\x03\x04\xff", 5)), 0x01020304);
    EXPECT_EQ(partition_hash(std::string("\xff\x00\x00\x00", 4)), -16777216);
    EXPECT_EQ(partition_hash(std::string("\x01\x02", 2)), 0);
    partition_map two({"a", "b"}, false), three({"a", "b", "c"}, true);
    EXPECT_EQ(two.partition_of_hash(-16777216), 0u);
    EXPECT_EQ(two.partition_of_hash(3), 1u);
    EXPECT_EQ(three.partition_of_hash(-7), 1u);  // abs(-7 % 3)
    EXPECT_THROW(partition_map({"a", "b", "c"}, false), std::runtime_error);
}

TEST_F(Scaleout, MapIsTheRoutersAndHashesAgreeOnManyKeys)
{
    pg::connection router(router_dsn());
    ASSERT_GE(pools_->map().size(), 2u);
    pg::result r = router.exec(
        "SELECT n, idem_key_partition(k), idem_partition_hash(k), idem_inbox_partition('consumer-' || n, 'msg-' || n),"
        "       idem_attempt_partition('target-' || n)"
        "  FROM generate_series(1, 3000) n,"
        "       LATERAL (SELECT sha256(convert_to('pk-' || n, 'UTF8')) AS k) s ORDER BY n");
    ASSERT_EQ(r.size(), 3000u);
    std::size_t per_partition[2] = {0, 0};
    for (std::size_t i = 0; i < r.size(); ++i)
    {
        const std::string n = std::to_string(i + 1);
        const digest k = sha256("pk-" + n);
        ASSERT_EQ(partition_hash(k), r.get_int(i, 2)) << "key pk-" << n;
        ASSERT_EQ(static_cast<std::int64_t>(pools_->map().partition_of(k)), r.get_int(i, 1)) << "key pk-" << n;
        ASSERT_EQ(static_cast<std::int64_t>(pools_->map().partition_of_message("consumer-" + n, "msg-" + n)),
                  r.get_int(i, 3))
            << "message " << n;
        ASSERT_EQ(static_cast<std::int64_t>(pools_->map().partition_of_text("target-" + n)), r.get_int(i, 4))
            << "target " << n;
        per_partition[pools_->map().partition_of(k) & 1]++;
    }
    EXPECT_GT(per_partition[0], 1300u);
    EXPECT_GT(per_partition[1], 1300u);
    // And idem_key computed through the router (on a partition) routes as the client's.
    req_data rq{unique_key("route")};
    pg::result kr = router.exec("SELECT idem_key_partition(idem_key('alice', 'POST', '/payments', $1))", rq.key);
    EXPECT_EQ(static_cast<std::int64_t>(pools_->map().partition_of(cache_key("alice", "POST", "/payments", rq.key))),
              kr.get_int(0, 0));
}

TEST_F(Scaleout, LeaseModeThroughTheRouter)
{
    simple_pool via_router(router_dsn());
    runner run(via_router, quick());
    req_data rq{unique_key("lease")};
    int runs = 0;
    auto h = [&](const claim_context &claim) {
        ++runs;
        return response{201, {{"Content-Type", "text/plain"}}, "paid " + std::to_string(claim.generation() > 0)};
    };
    run_result first = run.run(rq.view(), h);
    EXPECT_EQ(first.response.status, 201);
    EXPECT_FALSE(first.replayed);
    run_result again = run.run(rq.view(), h);
    EXPECT_TRUE(again.replayed);
    EXPECT_EQ(again.response.body, "paid 1");
    EXPECT_EQ(runs, 1);
    // The key is on its partition.
    auto c = pools_->for_key(cache_key("alice", "POST", "/payments", rq.key)).acquire();
    EXPECT_EQ(c->exec("SELECT outcome FROM idem_lookup($1, $2)", pg::bytea_view{rq.ck()},
                      pg::bytea_view{to_bytes(request_hash(rq.body))})
                  .get_text(0, 0),
              "replay");
}

TEST_F(Scaleout, InTransactionAndFencedCommitOnTheOwningPartition)
{
    partitioned_runner run(*pools_, quick());
    pg::connection router(router_dsn());
    for (int mode = 0; mode < 2; ++mode)
    {
        for (int i = 0; i < 6; ++i)  // keys on both partitions
        {
            req_data rq{unique_key(mode ? "fenced" : "intx")};
            const std::size_t owner = run.partition_of(rq.view());
            int runs = 0;
            auto h = [&](pg::transaction &tx, const claim_context &claim) {
                ++runs;
                tx.exec("INSERT INTO routed_payments VALUES ($1, $2)", rq.key, claim.generation());
                return response{201, {}, "booked " + rq.key};
            };
            run_result r = mode ? run.run_fenced(rq.view(), h) : run.run_in_transaction(rq.view(), h);
            EXPECT_EQ(r.response.status, 201);
            run_result again = mode ? run.run_fenced(rq.view(), h) : run.run_in_transaction(rq.view(), h);
            EXPECT_TRUE(again.replayed);
            EXPECT_EQ(again.response.body, "booked " + rq.key);
            EXPECT_EQ(runs, 1);
            EXPECT_EQ(rows_on(*pools_, owner, rq.key), 1) << "the write is on the owning partition";
            EXPECT_EQ(rows_on(*pools_, 1 - owner, rq.key), 0) << "and on no other";
            // The router finds the stored response where the client put it.
            EXPECT_EQ(router
                          .exec("SELECT outcome FROM idem_lookup($1, $2)", pg::bytea_view{rq.ck()},
                                pg::bytea_view{to_bytes(request_hash(rq.body))})
                          .get_text(0, 0),
                      "replay");
        }
    }
}

// Through the router, the modes whose point is one transaction on the
// partition are answered 503 with the reason, before anything is claimed.
TEST_F(Scaleout, FencedAndInTransactionRefusedThroughTheRouter)
{
    simple_pool via_router(router_dsn());
    runner run(via_router, quick());
    for (int mode = 0; mode < 2; ++mode)
    {
        req_data rq{unique_key(mode ? "router-fenced" : "router-intx")};
        int runs = 0;
        auto h = [&](pg::transaction &, const claim_context &) {
            ++runs;
            return response{201, {}, "booked"};
        };
        run_result r = mode ? run.run_fenced(rq.view(), h) : run.run_in_transaction(rq.view(), h);
        EXPECT_EQ(r.response.status, 503);
        EXPECT_EQ(runs, 0);
        ASSERT_TRUE(r.error);
        const std::string msg = describe_store_error(r.error, "claim").message;
        EXPECT_NE(msg.find(std::string(mode ? "fenced" : "in-transaction") +
                           " mode cannot run through a PL/Proxy router"),
                  std::string::npos)
            << msg;
        auto c = pools_->for_key(cache_key("alice", "POST", "/payments", rq.key)).acquire();
        EXPECT_EQ(c->exec("SELECT outcome FROM idem_lookup($1, $2)", pg::bytea_view{rq.ck()},
                          pg::bytea_view{to_bytes(request_hash(rq.body))})
                      .get_text(0, 0),
                  "absent")
            << "nothing was claimed";
    }
}

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    if (router_dsn().empty())
    {
        std::fprintf(stderr, "PG_IDEM_SCALEOUT_ROUTER is not set: only the tests without a server run "
                             "(the scaleout suite runs them all)\n");
        ::testing::GTEST_FLAG(filter) = "PartitionHash.*";
    }
    return RUN_ALL_TESTS();
}
