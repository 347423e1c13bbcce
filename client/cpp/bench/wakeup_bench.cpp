// Follower wake-up latency: time from the winner's finalize commit to the
// return of followers waiting on the same key. Not a test: prints numbers.
//
//   idem_wakeup_bench [DSN] [rounds] [followers]
//
// DSN defaults to $PG_IDEM_TEST_DSN; the database needs pg_idem (created
// if missing). Runs with the advisory-lock wake-up and with polling only.
#include <idem/runner.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

// Records when the winner's result committed ("finalized" is emitted right
// after the finalize statement returns; its commit released the wake-up
// lock, so followers may already be reading the key).
class commit_clock : public idem::metrics
{
public:
    void on_event(idem::event e) override
    {
        if (e == idem::event::finalized)
            at_.store(clk::now().time_since_epoch().count());
    }
    clk::time_point at() const { return clk::time_point(clk::duration(at_.load())); }

private:
    std::atomic<clk::rep> at_{0};
};

double percentile(std::vector<double> v, double p)
{
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

void bench(const std::string &dsn, idem::follower_wakeup mode, int rounds, int followers)
{
    idem::simple_pool pool(dsn, static_cast<std::size_t>(followers + 4));
    commit_clock clock;
    idem::runner run(pool,
                     idem::config::builder().lease(5s).follower_wait_budget(5s).wakeup(mode).build(),
                     &clock);
    std::vector<double> latencies_ms;
    std::mutex mu;
    for (int round = 0; round < rounds; ++round)
    {
        const std::string key = "bench-" + std::to_string(clk::now().time_since_epoch().count()) + "-" +
                                std::to_string(round);
        idem::request_view req;
        req.principal = "bench";
        req.method = "POST";
        req.target = "/bench";
        req.idempotency_keys = {key};
        req.body = "x";
        std::promise<void> entered;
        auto winner = std::async(std::launch::async, [&] {
            return run.run(req, [&](const idem::claim_context &) {
                entered.set_value();
                std::this_thread::sleep_for(60ms);  // followers are waiting by now
                return idem::response{200, {}, "done"};
            });
        });
        entered.get_future().wait();
        std::vector<std::future<clk::time_point>> fs;
        for (int i = 0; i < followers; ++i)
            fs.push_back(std::async(std::launch::async, [&] {
                run.run(req, [](const idem::claim_context &) { return idem::response{500, {}, ""}; });
                return clk::now();
            }));
        winner.get();
        for (auto &f : fs)
        {
            const auto done = f.get();
            std::lock_guard<std::mutex> lk(mu);
            latencies_ms.push_back(std::chrono::duration<double, std::milli>(done - clock.at()).count());
        }
    }
    std::printf("%-14s rounds=%d followers=%d  p50=%.2f ms  p99=%.2f ms  max=%.2f ms\n",
                mode == idem::follower_wakeup::advisory_lock ? "advisory_lock" : "polling", rounds,
                followers, percentile(latencies_ms, 0.50), percentile(latencies_ms, 0.99),
                percentile(latencies_ms, 1.0));
}

}  // namespace

int main(int argc, char **argv)
{
    const char *env = std::getenv("PG_IDEM_TEST_DSN");
    const std::string dsn = argc > 1 ? argv[1] : (env ? env : "");
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 50;
    const int followers = argc > 3 ? std::atoi(argv[3]) : 4;
    if (dsn.empty())
    {
        std::fprintf(stderr, "usage: %s DSN [rounds] [followers]  (or set PG_IDEM_TEST_DSN)\n", argv[0]);
        return 2;
    }
    try
    {
        idem::pg::connection c(dsn);
        c.exec("CREATE EXTENSION IF NOT EXISTS pg_idem");
        bench(dsn, idem::follower_wakeup::advisory_lock, rounds, followers);
        bench(dsn, idem::follower_wakeup::polling, rounds, followers);
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
