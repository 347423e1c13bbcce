// Several OS processes, each with its own connections.
#include "test_support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

using namespace idem;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

struct child
{
    pid_t pid = -1;
    std::string out_path;
};

child spawn_helper(const std::vector<std::string> &args, const std::string &out_path)
{
    std::vector<char *> argv;
    std::string helper = IDEM_TEST_HELPER;
    argv.push_back(helper.data());
    std::vector<std::string> copy = args;
    for (std::string &a : copy)
        argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0)
    {
        int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0)
        {
            dup2(fd, STDOUT_FILENO);
            close(fd);
        }
        execv(argv[0], argv.data());
        _exit(127);
    }
    return child{pid, out_path};
}

int wait_exit(pid_t pid)
{
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const std::string &path)
{
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string temp_path(const std::string &name)
{
    const char *dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/idem-client-" + std::to_string(getpid()) + "-" + name;
}

}  // namespace

TEST(Processes, TwoProcessesRunOnce)
{
    IDEM_REQUIRE_DB();
    const std::string key = idem_test::unique_key("procs");
    std::vector<child> kids;
    for (int i = 0; i < 3; ++i)
        kids.push_back(spawn_helper({"once", idem_test::dsn(), key, "2000", "400", "p" + std::to_string(i)},
                                    temp_path("out" + std::to_string(i))));
    std::vector<std::string> outs;
    int ran = 0;
    for (const child &k : kids)
    {
        EXPECT_EQ(wait_exit(k.pid), 0);
        outs.push_back(slurp(k.out_path));
        std::remove(k.out_path.c_str());
        ran += outs.back().find("ran=1") != std::string::npos;
    }
    EXPECT_EQ(ran, 1);
    EXPECT_EQ(idem_test::count_rows("effects", key), 1);
    // Every process answered with the same response.
    const std::string body = outs[0].substr(outs[0].find("body="));
    for (const std::string &o : outs)
    {
        EXPECT_NE(o.find("status=201"), std::string::npos) << o;
        EXPECT_EQ(o.substr(o.find("body=")), body);
    }
}

TEST(Processes, KilledWinnerIsRecoveredAfterTheLease)
{
    IDEM_REQUIRE_DB();
    const std::string key = idem_test::unique_key("killed");
    child k = spawn_helper({"hang", idem_test::dsn(), key, "500", "0", "victim"}, temp_path("hang"));
    // Wait until the winner is inside its handler.
    const auto until = clk::now() + 10s;
    while (idem_test::count_rows("effects", key) == 0 && clk::now() < until)
        std::this_thread::sleep_for(10ms);
    ASSERT_EQ(idem_test::count_rows("effects", key), 1) << "helper never entered its handler";
    kill(k.pid, SIGKILL);
    wait_exit(k.pid);
    std::remove(k.out_path.c_str());

    simple_pool pool(idem_test::dsn());
    idem_test::counting_metrics m;
    runner run(pool,
               idem_test::config_builder().lease(500ms).follower_wait_budget(30s).poll(10ms, 100ms).build(), &m);
    request_view req;
    req.principal = "proc";
    req.method = "POST";
    req.target = "/jobs";
    req.idempotency_keys = {key};
    req.body = "same body";
    const auto t0 = clk::now();
    run_result r = run.run(req, [&](const claim_context &) { return response{201, {}, "recovered"}; });
    const auto took = clk::now() - t0;
    EXPECT_TRUE(r.handler_ran);
    EXPECT_EQ(r.response.body, "recovered");
    EXPECT_EQ(m.count(event::recovered_abandoned), 1);
    EXPECT_LT(took, 10s);  // the lease (500 ms) plus polling, not the wait budget (30 s)
    // At-least-once boundary: the killed winner's effect happened too.
    EXPECT_EQ(idem_test::count_rows("effects", key), 1);  // the recovery's handler did not insert
}
