// Follower wake-up latency: time from the winner's finalize commit to the
// return of followers waiting on the same key. Not a test: prints numbers.
//
//   idem_wakeup_bench [DSN] [rounds] [followers]
//
// DSN defaults to $PG_IDEM_TEST_DSN; the database needs pg_idem (created
// if missing). Compares three wake-ups:
//   server_wait    the runner, followers waiting inside idem_claim
//                  (max_wait, pg_idem 0.3.0; skipped on an older server);
//   advisory_lock  0.2.0's wake-up, kept here only as a baseline: the
//                  winner's session holds an advisory lock, followers block
//                  on it in shared mode, then read the key (raw statements,
//                  the runner no longer does this; it breaks behind
//                  transaction-mode poolers);
//   polling        the runner with follower_wakeup::polling.
#include <idem/runner.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

// Records when the winner's result committed ("finalized" is emitted right
// after the finalize statement returns; followers woken by its commit may
// return before that: latencies can be negative).  With many followers on
// few cores the finalize returns late (its commit's broadcast shares the
// cores with the backends it woke), so bench() also times each follower
// from the handler's return, just before the finalize is sent: the zero of
// tests/bench/growth_wakeup.py.
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

void report(const char *name, int rounds, int followers, const std::vector<double> &latencies_ms)
{
    std::printf("%-14s rounds=%d followers=%d  p50=%.2f ms  p99=%.2f ms  max=%.2f ms\n", name, rounds,
                followers, percentile(latencies_ms, 0.50), percentile(latencies_ms, 0.99),
                percentile(latencies_ms, 1.0));
}

std::string bytes(const idem::digest &d) { return idem::to_bytes(d); }

// 0.2.0's advisory-lock wake-up, with raw statements: the winner takes the
// lock with its claim and hands it over to the finalize's transaction;
// followers block on it (lock_timeout 5 s), then look the key up.
void bench_advisory(const std::string &dsn, int rounds, int followers)
{
    using idem::pg::as_bytea;
    idem::pg::connection w(dsn);
    std::vector<std::unique_ptr<idem::pg::connection>> fc;
    for (int i = 0; i < followers; ++i)
        fc.push_back(std::make_unique<idem::pg::connection>(dsn));
    std::vector<double> latencies_ms;
    std::mutex mu;
    constexpr int cls = 0x6964656d;
    for (int round = 0; round < rounds; ++round)
    {
        const std::string key = "adv-" + std::to_string(clk::now().time_since_epoch().count()) + "-" +
                                std::to_string(round);
        const std::string ck = bytes(idem::cache_key("bench", "POST", "/bench", key));
        const std::string rh = bytes(idem::request_hash("x"));
        const int lk = static_cast<int>(static_cast<unsigned char>(ck[0]) << 24 |
                                        static_cast<unsigned char>(ck[1]) << 16 |
                                        static_cast<unsigned char>(ck[2]) << 8 |
                                        static_cast<unsigned char>(ck[3]));
        idem::pg::result r = w.exec("SELECT r.claim_id::text, pg_catalog.pg_try_advisory_lock($3, $4) "
                                    "FROM idem_claim($1, $2, '5 s'::interval) r",
                                    as_bytea(ck), as_bytea(rh), cls, lk);
        const std::string claim_id = r.get_text(0, 0);
        std::atomic<int> waiting{0};
        std::vector<std::future<clk::time_point>> fs;
        for (int i = 0; i < followers; ++i)
            fs.push_back(std::async(std::launch::async, [&, i] {
                idem::pg::connection &c = *fc[static_cast<std::size_t>(i)];
                for (;;)
                {
                    idem::pg::result s = c.exec("SELECT outcome FROM idem_lookup($1, $2)",
                                                as_bytea(ck), as_bytea(rh));
                    if (s.get_text(0, 0) != "in_progress")
                        return clk::now();
                    waiting++;
                    c.exec("SELECT 1 FROM (SELECT pg_catalog.set_config('lock_timeout', '5s', true) AS lt) s "
                           "CROSS JOIN LATERAL pg_catalog.pg_advisory_xact_lock_shared("
                           "CASE WHEN s.lt IS NOT NULL THEN $1::int4 END, $2::int4) l",
                           cls, lk);
                }
            }));
        while (waiting.load() < followers)
            std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(20ms);  // followers are blocked by now
        w.exec("SELECT idem_finalize($1, $2::uuid, 200, '{}'::jsonb, 'done'::bytea), "
               "CASE WHEN pg_catalog.pg_try_advisory_xact_lock($3, $4) "
               "THEN pg_catalog.pg_advisory_unlock($3, $4) END",
               as_bytea(ck), claim_id, cls, lk);
        const clk::time_point committed = clk::now();
        for (auto &f : fs)
        {
            const auto done = f.get();
            std::lock_guard<std::mutex> g(mu);
            latencies_ms.push_back(std::chrono::duration<double, std::milli>(done - committed).count());
        }
    }
    report("advisory_lock", rounds, followers, latencies_ms);
}

void bench(const std::string &dsn, idem::follower_wakeup mode, int rounds, int followers)
{
    idem::simple_pool pool(dsn, static_cast<std::size_t>(followers + 4));
    commit_clock clock;
    idem::runner run(pool,
                     idem::config::builder().lease(5s).follower_wait_budget(5s).wakeup(mode).build(),
                     &clock);
    std::vector<double> latencies_ms, from_send_ms;
    std::mutex mu;
    // Round 0 opens the pool's connections and is not counted.
    for (int round = 0; round <= rounds; ++round)
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
        std::atomic<clk::rep> handler_done{0};
        auto winner = std::async(std::launch::async, [&] {
            return run.run(req, [&](const idem::claim_context &) {
                entered.set_value();
                // followers are waiting by now
                std::this_thread::sleep_for(std::max<std::chrono::milliseconds>(60ms, followers * 2ms));
                handler_done.store(clk::now().time_since_epoch().count());
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
            if (round == 0)
                continue;
            std::lock_guard<std::mutex> lk(mu);
            latencies_ms.push_back(std::chrono::duration<double, std::milli>(done - clock.at()).count());
            const clk::time_point sent(clk::duration(handler_done.load()));
            from_send_ms.push_back(std::chrono::duration<double, std::milli>(done - sent).count());
        }
    }
    report(mode == idem::follower_wakeup::server_wait ? "server_wait" : "polling", rounds,
           followers, latencies_ms);
    // Indented: tests/bench/report.py reads only the lines above.
    report("  from_send", rounds, followers, from_send_ms);
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
        const bool has_wait =
            c.exec("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE proname = 'idem_claim' "
                   "AND pronargs = 4)")
                .get_bool(0, 0);
        if (has_wait)
            bench(dsn, idem::follower_wakeup::server_wait, rounds, followers);
        else
            std::printf("server_wait    skipped: this server's idem_claim has no max_wait\n");
        bench_advisory(dsn, rounds, followers);
        bench(dsn, idem::follower_wakeup::polling, rounds, followers);
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
