// A handler's validation failure (400, 422: protocol::validation_statuses)
// in every mode of the runner, against the server: released by default, so
// that the corrected request with the same key runs (as the Python and Node
// clients do, and Stripe); stored and replayed with client_errors::store,
// as the protocol's storage rules say. Releasing is what the runner does
// for every status that releases a key (401, 403, 3xx): in the fenced and
// in-transaction modes the handler's own writes commit, as in the Python
// and Node clients (their fenced mode commits the handler's transaction,
// then releases; their in-transaction mode commits idem_release with it).
#include "test_support.hpp"

#include <string>

using namespace idem;
using namespace std::chrono_literals;

namespace {

using req_data = idem_test::test_request;

enum class mode
{
    lease,
    fenced,
    in_transaction
};

const char *mode_name(mode m)
{
    switch (m)
    {
    case mode::lease:
        return "lease";
    case mode::fenced:
        return "fenced";
    case mode::in_transaction:
        return "in_transaction";
    }
    return "?";
}

config::builder quick()
{
    return idem_test::config_builder().lease(2s).follower_wait_budget(3s).poll(10ms, 100ms).failure_cooldown(300ms);
}

// One request in mode m whose handler answers status; in the modes with a
// transaction it first writes a row to effects (key, who), which commits
// or rolls back with the transaction.
run_result send(const runner &run, mode m, const req_data &rq, int status, int &runs)
{
    const std::string body = "s" + std::to_string(status);
    switch (m)
    {
    case mode::lease:
        return run.run(rq.view(), [&](const claim_context &) {
            runs++;
            return response{status, {{"Content-Type", "application/json"}}, body};
        });
    case mode::fenced:
        return run.run_fenced(rq.view(), [&](pg::transaction &tx, const claim_context &claim) {
            runs++;
            tx.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, $3)", rq.key,
                    claim.generation(), body);
            return response{status, {{"Content-Type", "application/json"}}, body};
        });
    case mode::in_transaction:
        return run.run_in_transaction(rq.view(), [&](pg::transaction &tx, const claim_context &claim) {
            runs++;
            tx.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, $3)", rq.key,
                    claim.generation(), body);
            return response{status, {{"Content-Type", "application/json"}}, body};
        });
    }
    ADD_FAILURE() << "unknown mode";
    return {};
}

bool has_transaction(mode m) { return m != mode::lease; }

bool is_replay(const run_result &r)
{
    return r.replayed && r.response.header_value(replay_header_name).value_or("") == "true";
}

// The key's row: its state and stored status ("" for none).
std::string key_row(const req_data &rq)
{
    pg::connection c(idem_test::dsn());
    pg::result r = c.exec("SELECT state, coalesce(response_status::text, '') FROM idem_keys WHERE cache_key = $1",
                          pg::as_bytea(rq.ck()));
    if (r.empty())
        return "none";
    return r.get_text(0, 0) + " " + r.get_text(0, 1);
}

class ClientErrors : public ::testing::TestWithParam<mode>
{
};

}  // namespace

// The default: a 400 or 422 is answered but not stored; its retry runs the
// handler again, and so does the corrected request with the same key, whose
// 201 is stored and replayed.
TEST_P(ClientErrors, ReleasedByDefault)
{
    IDEM_REQUIRE_DB();
    const mode m = GetParam();
    simple_pool pool(idem_test::dsn(), 4);
    idem_test::counting_metrics metrics;
    runner run(pool, quick().build(), &metrics);
    ASSERT_EQ(run.settings().client_errors(), client_errors::release);
    for (int status : {400, 422})
    {
        SCOPED_TRACE(std::string(mode_name(m)) + " " + std::to_string(status));
        req_data invalid{idem_test::unique_key("client-error-release")};
        invalid.body = R"({"amount": -5})";
        req_data corrected = invalid;
        corrected.body = R"({"amount": 5})";
        int runs = 0;
        const int finalized_before = metrics.count(event::finalized);

        run_result first = send(run, m, invalid, status, runs);
        EXPECT_EQ(first.response.status, status);
        EXPECT_EQ(first.response.body, "s" + std::to_string(status));
        EXPECT_EQ(first.outcome, outcome::won_completed);
        EXPECT_TRUE(first.handler_ran);
        EXPECT_FALSE(first.replayed);
        EXPECT_EQ(metrics.count(event::finalized), finalized_before);
        EXPECT_EQ(key_row(invalid), "failed ");  // released: a tombstone without a response

        // The key is free: the same request runs again...
        run_result again = send(run, m, invalid, status, runs);
        EXPECT_EQ(again.response.status, status);
        EXPECT_TRUE(again.handler_ran);
        EXPECT_FALSE(is_replay(again));
        EXPECT_EQ(runs, 2);

        // ... and the corrected one runs, is stored and replayed.
        run_result fixed = send(run, m, corrected, 201, runs);
        EXPECT_EQ(fixed.response.status, 201);
        EXPECT_EQ(fixed.outcome, outcome::won_completed);
        EXPECT_EQ(runs, 3);
        run_result replay = send(run, m, corrected, 201, runs);
        EXPECT_TRUE(is_replay(replay));
        EXPECT_EQ(replay.response.status, 201);
        EXPECT_EQ(runs, 3);
        EXPECT_EQ(key_row(invalid), "completed 201");

        // The released runs' writes committed, as for any released status.
        if (has_transaction(m))
        {
            EXPECT_EQ(idem_test::count_rows("effects", invalid.key), 3);
        }
    }
    // Only the validation statuses: a 404 is stored as the rules say.
    req_data gone{idem_test::unique_key("client-error-404")};
    int runs = 0;
    EXPECT_EQ(send(run, m, gone, 404, runs).response.status, 404);
    run_result replay = send(run, m, gone, 404, runs);
    EXPECT_TRUE(is_replay(replay));
    EXPECT_EQ(replay.response.status, 404);
    EXPECT_EQ(runs, 1);
}

// client_errors::store: a 400 or 422 is stored and replayed to the retry,
// and the corrected request with the same key is answered "key reused".
TEST_P(ClientErrors, StoredWithTheOption)
{
    IDEM_REQUIRE_DB();
    const mode m = GetParam();
    simple_pool pool(idem_test::dsn(), 4);
    runner run(pool, quick().client_errors(client_errors::store).build());
    for (int status : {400, 422})
    {
        SCOPED_TRACE(std::string(mode_name(m)) + " " + std::to_string(status));
        req_data invalid{idem_test::unique_key("client-error-store")};
        invalid.body = R"({"amount": -5})";
        req_data corrected = invalid;
        corrected.body = R"({"amount": 5})";
        int runs = 0;

        run_result first = send(run, m, invalid, status, runs);
        EXPECT_EQ(first.response.status, status);
        EXPECT_EQ(first.outcome, outcome::won_completed);
        EXPECT_EQ(key_row(invalid), "completed " + std::to_string(status));

        run_result again = send(run, m, invalid, status, runs);
        EXPECT_TRUE(is_replay(again));
        EXPECT_EQ(again.outcome, outcome::replay);
        EXPECT_EQ(again.response.status, status);
        EXPECT_EQ(again.response.body, "s" + std::to_string(status));
        EXPECT_EQ(runs, 1);

        run_result fixed = send(run, m, corrected, 201, runs);
        EXPECT_EQ(fixed.outcome, outcome::conflict);
        EXPECT_EQ(fixed.response.status, 422);  // the ietf profile's key_reused
        EXPECT_NE(fixed.response.body.find("urn:pg-idem:problem:idempotency-key-reused"), std::string::npos)
            << fixed.response.body;
        EXPECT_EQ(runs, 1);
        if (has_transaction(m))
        {
            EXPECT_EQ(idem_test::count_rows("effects", invalid.key), 1);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(EveryMode, ClientErrors,
                         ::testing::Values(mode::lease, mode::fenced, mode::in_transaction),
                         [](const ::testing::TestParamInfo<mode> &info) { return std::string(mode_name(info.param)); });
