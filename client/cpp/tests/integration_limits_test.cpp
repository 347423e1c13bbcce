// A client's own limits (issue 31), as the three clients agree on them by
// client/conformance/protocol.json (protocol.toml [client.missing_principal],
// [client.pool], [client.startup]), against the real server:
//
//   * a guarded request without a principal is refused, 401
//     principal-missing, never keyed on "" nor run;
//   * a bounded pool that gives no connection in time is answered 503
//     connection-pool-exhausted, counted and reported with its fix, never
//     "the server cannot be reached"; duplicates of a slow request keep to
//     their share of it, so first requests on other keys still run;
//   * runner::check() refuses to start for a role, database or socket that
//     does not exist, and waits for a server that comes up meanwhile.
//
// No test waits a fixed time: handlers block on futures the test
// fulfils, and the tests wait for states with generous deadlines.
#include "test_support.hpp"

#include <idem/protocol.hpp>

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace idem;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const json &spec()
{
    static const json doc = [] {
        std::ifstream in(IDEM_CONFORMANCE_FILE);
        if (!in)
            throw std::runtime_error("cannot read " IDEM_CONFORMANCE_FILE);
        return json::parse(in);
    }();
    return doc;
}

void expect_problem(const response &r, const json &c)
{
    const json body = json::parse(r.body);
    EXPECT_EQ(r.status, c["status"]["ietf"].get<int>()) << r.body;
    EXPECT_EQ(body["type"], c["type"]);
    EXPECT_EQ(r.header_value("Retry-After").has_value(), c["retry_after"].get<bool>()) << r.body;
}

template <typename F>
void wait_until(F done, const char *what)
{
    const auto end = std::chrono::steady_clock::now() + 60s;
    while (!done())
    {
        ASSERT_LT(std::chrono::steady_clock::now(), end) << "still waiting for " << what;
        std::this_thread::sleep_for(10ms);
    }
}

response made(const claim_context &) { return response{201, {}, "made"}; }

}  // namespace

TEST(ClientLimits, PrincipalVectors)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    runner run(pool, idem_test::config_builder().log_errors(false).build());
    for (const json &c : spec()["principal_vectors"])
    {
        SCOPED_TRACE(c.dump());
        const std::string tag = idem_test::unique_key("principal");
        std::vector<std::string> keys;
        for (const json &k : c["keys"])
            keys.push_back(k.get<std::string>() + tag);
        const std::string principal = c["principal"];
        request_view req;
        req.principal = principal;
        req.method = "POST";
        req.target = "/principal";
        for (const std::string &k : keys)
            req.idempotency_keys.push_back(k);
        req.body = "{}";
        req.key_required = c["key_required"];
        int runs = 0;
        run_result r = run.run(req, [&](const claim_context &ctx) {
            ++runs;
            return made(ctx);
        });
        EXPECT_EQ(r.handler_ran, c["handler_ran"].get<bool>());
        EXPECT_EQ(runs, c["handler_ran"].get<bool>() ? 1 : 0);
        EXPECT_EQ(to_string(r.outcome), c["result"].get<std::string>());
        if (c.contains("problem"))
            expect_problem(r.response, c);
    }
}

TEST(ClientLimits, AnExhaustedPoolIsItsOwnAnswer)
{
    IDEM_REQUIRE_DB();
    const json &c = spec()["pool_exhausted"];
    simple_pool pool(idem_test::dsn(), simple_pool::options{8, 1, 200ms});
    idem_test::counting_metrics metrics;
    std::mutex mu;
    std::vector<store_error> reports;
    runner run(pool,
               idem_test::config_builder()
                   .log_errors(false)
                   .on_error([&](const store_error &e) {
                       std::lock_guard<std::mutex> lk(mu);
                       reports.push_back(e);
                   })
                   .build(),
               &metrics);
    EXPECT_EQ(to_string(event::pool_exhausted), c["event"].get<std::string>());
    std::vector<run_result> results;
    {
        connection_handle held = pool.acquire();  // the application's own query holds the only one
        for (int i = 0; i < 2; ++i)
        {
            idem_test::test_request req{idem_test::unique_key("pool")};
            results.push_back(run.run(req.view(), made));
        }
    }
    for (const run_result &r : results)
    {
        EXPECT_FALSE(r.handler_ran);
        expect_problem(r.response, c);
        EXPECT_EQ(to_string(r.outcome), c["result"].get<std::string>());
    }
    EXPECT_EQ(metrics.count(event::pool_exhausted), 2);
    ASSERT_EQ(reports.size(), 2u);
    EXPECT_EQ(reports[0].during, "connection pool");
    EXPECT_NE(reports[0].fix.find(protocol::pool_exhausted_fix), std::string::npos) << reports[0].fix;
    EXPECT_NE(reports[0].fix.find("the pool has 1 connections"), std::string::npos) << reports[0].fix;
    EXPECT_EQ(reports[0].fix.find("cannot be reached"), std::string::npos) << reports[0].fix;
    idem_test::test_request again{idem_test::unique_key("pool")};
    EXPECT_EQ(run.run(again.view(), made).response.status, 201);  // free again: served
}

TEST(ClientLimits, DuplicatesOfASlowRequestLeaveThePoolToFirstRequests)
{
    IDEM_REQUIRE_DB();
    if (std::getenv("PG_IDEM_TEST_POOLER"))
        GTEST_SKIP() << "counts the server's sessions by application_name, which a pooler hides";
    const std::string app = idem_test::unique_key("idem_storm");
    simple_pool pool(idem_test::dsn_with(idem_test::dsn(), "application_name", app),
                     simple_pool::options{10, 10, protocol::pool_wait});
    runner run(pool, idem_test::config_builder().follower_wait_budget(120s).build());
    std::promise<void> release, started;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<int> runs{0};
    const std::string key = idem_test::unique_key("storm");
    auto slow = [&](const claim_context &) {
        if (runs++ == 0)
        {
            started.set_value();
            released.wait();
        }
        return response{201, {}, "paid"};
    };
    std::vector<run_result> results(31);
    std::vector<std::thread> threads;
    threads.emplace_back([&] { results[0] = run.run(idem_test::test_request{key}.view(), slow); });
    started.get_future().wait();
    for (int i = 1; i <= 30; ++i)
        threads.emplace_back([&, i] { results[i] = run.run(idem_test::test_request{key}.view(), slow); });
    // Duplicates wait in the server: at least their share (before, each
    // held a connection for its whole wait and the pool was theirs).
    pg::connection watch(idem_test::dsn());
    wait_until(
        [&] {
            return watch
                       .exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                             "AND state = 'active' AND query LIKE '%idem_claim%'",
                             app)
                       .get_int(0, 0) >= 5;
        },
        "duplicates waiting in the server");
    std::vector<run_result> others;
    for (int i = 0; i < 5; ++i)
    {
        idem_test::test_request other{idem_test::unique_key("other")};
        others.push_back(run.run(other.view(), made));
    }
    const bool still_running = runs.load() == 1;
    release.set_value();
    for (std::thread &t : threads)
        t.join();
    EXPECT_TRUE(still_running);
    for (const run_result &r : others)
        EXPECT_EQ(r.response.status, 201) << r.response.body;
    EXPECT_EQ(runs.load(), 1);
    int replayed = 0;
    for (const run_result &r : results)
    {
        EXPECT_EQ(r.response.status, 201) << r.response.body;
        replayed += r.replayed ? 1 : 0;
    }
    EXPECT_EQ(replayed, 30);
}

namespace {

// A database without the extension and a role without idem_client.
struct startup_fixture
{
    std::string bare = idem_test::unique_key("idem_cpp_bare");
    std::string role = idem_test::unique_key("idem_cpp_norights");
    startup_fixture()
    {
        pg::connection admin(idem_test::base_dsn());
        admin.exec("CREATE DATABASE \"" + bare + "\"");
        admin.exec("CREATE ROLE \"" + role + "\" LOGIN");
    }
    ~startup_fixture()
    {
        pg::connection admin(idem_test::base_dsn());
        admin.exec("DROP DATABASE IF EXISTS \"" + bare + "\" WITH (FORCE)");
        admin.exec("DROP ROLE IF EXISTS \"" + role + "\"");
    }
};

std::string check_refusal(const std::string &dsn)
{
    simple_pool pool(dsn);
    runner run(pool, idem_test::config_builder().log_errors(false).build());
    try
    {
        run.check(300ms);
        return "";
    }
    catch (const setup_error &e)
    {
        return e.what();
    }
}

}  // namespace

TEST(ClientLimits, StartUpRefusesWhatCannotServe)
{
    IDEM_REQUIRE_DB();
    if (std::getenv("PG_IDEM_TEST_POOLER"))
        GTEST_SKIP() << "a pooler answers for the roles and databases it knows";
    startup_fixture f;
    const std::string dsn = idem_test::dsn();
    const std::string missing_dir = "/nonexistent-" + idem_test::unique_key("dir");
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {idem_test::dsn_with(dsn, "user", "idem_no_such_role"),
         {"refused this runner at start-up", "role \"idem_no_such_role\" does not exist",
          "Fix: the server refused the role"}},
        {idem_test::dsn_with(dsn, "dbname", "idem_no_such_db"),
         {"database \"idem_no_such_db\" does not exist", "Fix: the connection string names a database"}},
        {idem_test::dsn_with(dsn, "dbname", f.bare), {"CREATE EXTENSION"}},
        {idem_test::dsn_with(dsn, "user", f.role), {"GRANT idem_client"}},
        {idem_test::dsn_with(idem_test::dsn_with(dsn, "host", missing_dir), "port", "5432"),
         {"no server answered within 300 ms", missing_dir + "/.s.PGSQL.5432",
          "Fix: check the connection string's host and port"}},
    };
    for (const auto &[conninfo, words] : cases)
    {
        const std::string message = check_refusal(conninfo);
        for (const std::string &w : words)
            EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
    }
}

namespace {

// client/conformance/flight_relay.py --closed in a process of its own: a
// port that refuses connections until open().
class closed_relay
{
public:
    closed_relay(const std::string &host, const std::string &port)
    {
        int in[2], out[2];
        if (pipe(in) != 0 || pipe(out) != 0)
            throw std::runtime_error("pipe");
        pid_ = fork();
        if (pid_ == 0)
        {
            dup2(in[0], 0);
            dup2(out[1], 1);
            close(in[1]);
            close(out[0]);
            execlp("python3", "python3", IDEM_FLIGHT_RELAY, host.c_str(), port.c_str(), "--closed",
                   static_cast<char *>(nullptr));
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        to_ = fdopen(in[1], "w");
        from_ = fdopen(out[0], "r");
        port_ = std::stoi(line().substr(5));  // "port N"
    }
    ~closed_relay()
    {
        std::fclose(to_);  // end of input stops it
        std::fclose(from_);
        waitpid(pid_, nullptr, 0);
    }
    int port() const { return port_; }
    void open()
    {
        std::fputs("open\n", to_);
        std::fflush(to_);
        EXPECT_EQ(line(), "open");
    }

private:
    std::string line()
    {
        char buf[256];
        if (!std::fgets(buf, sizeof buf, from_))
            throw std::runtime_error("the relay said nothing");
        std::string s(buf);
        return s.substr(0, s.find('\n'));
    }
    pid_t pid_;
    FILE *to_ = nullptr, *from_ = nullptr;
    int port_ = 0;
};

std::string conninfo_value(const std::string &dsn, const std::string &keyword)
{
    pg::connection c(dsn);
    return c.exec(keyword == "host" ? "SELECT current_setting('unix_socket_directories')"
                                    : "SELECT current_setting('port')")
        .get_text(0, 0);
}

}  // namespace

TEST(ClientLimits, StartUpWaitsForAServerThatComesUp)
{
    IDEM_REQUIRE_DB();
    if (std::getenv("PG_IDEM_TEST_POOLER"))
        GTEST_SKIP() << "relays to the server itself";
    const std::string dsn = idem_test::dsn();
    std::string dir = conninfo_value(dsn, "host");
    dir = dir.substr(0, dir.find(','));
    closed_relay relay(dir, conninfo_value(dsn, "port"));
    std::promise<void> failed_once;
    std::once_flag once;
    simple_pool pool(idem_test::dsn_with(idem_test::dsn_with(dsn, "host", "127.0.0.1"), "port",
                                         std::to_string(relay.port())));
    runner run(pool, idem_test::config_builder()
                         .log_errors(false)
                         .on_error([&](const store_error &e) {
                             if (e.during == "start-up check")
                                 std::call_once(once, [&] { failed_once.set_value(); });
                         })
                         .build());
    std::future<void> checked = std::async(std::launch::async, [&] { run.check(120s); });
    ASSERT_EQ(failed_once.get_future().wait_for(60s), std::future_status::ready);
    relay.open();
    ASSERT_EQ(checked.wait_for(120s), std::future_status::ready);
    EXPECT_NO_THROW(checked.get());
    idem_test::test_request req{idem_test::unique_key("late")};
    EXPECT_EQ(run.run(req.view(), made).response.status, 201);
}
