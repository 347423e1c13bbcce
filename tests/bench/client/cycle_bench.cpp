// The uncontended new-key cycle through the C++ client's runner, with the
// follower wake-up (advisory lock, the default) and with it disabled
// (polling only): what the wake-up costs a request nobody waits for.
//
//   idem_cycle_bench DSN seconds rounds
//
// Prints one line per run, "mode=... round=... requests=... seconds=...",
// the two modes alternating (the first mode alternates too), so that the
// machine's drift hits both alike.
#include <idem/runner.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using clk = std::chrono::steady_clock;

// Requests completed in about `seconds`, each with a key of its own.
long cycle(const std::string &dsn, idem::follower_wakeup mode, double seconds, int round)
{
    idem::simple_pool pool(dsn, 2);
    idem::runner run(pool, idem::config::builder().wakeup(mode).build());
    const std::string prefix = "cycle-" + std::to_string(clk::now().time_since_epoch().count()) +
                               "-" + std::to_string(round) + "-";
    idem::request_view req;
    req.principal = "bench";
    req.method = "POST";
    req.target = "/bench";
    req.body = "{\"amount\": 1}";
    const auto end = clk::now() + std::chrono::duration<double>(seconds);
    long n = 0;
    while (clk::now() < end)
    {
        const std::string key = prefix + std::to_string(n);
        req.idempotency_keys = {key};
        const auto r = run.run(req, [](const idem::claim_context &) {
            return idem::response{201, {{"Content-Type", "application/json"}}, "{\"id\": 42}"};
        });
        if (!r.handler_ran)
            throw std::runtime_error("an uncontended request did not run its handler");
        ++n;
    }
    return n;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc < 4)
    {
        std::fprintf(stderr, "usage: %s DSN seconds rounds\n", argv[0]);
        return 2;
    }
    const std::string dsn = argv[1];
    const double seconds = std::atof(argv[2]);
    const int rounds = std::atoi(argv[3]);
    try
    {
        for (int round = 1; round <= rounds; ++round)
            for (int i = 0; i < 2; ++i)
            {
                const bool lock = (i + round) % 2 == 0;
                const auto start = clk::now();
                const long n = cycle(dsn, lock ? idem::follower_wakeup::advisory_lock
                                               : idem::follower_wakeup::polling,
                                     seconds, round);
                const double took = std::chrono::duration<double>(clk::now() - start).count();
                std::printf("mode=%s round=%d requests=%ld seconds=%.3f\n",
                            lock ? "advisory_lock" : "polling", round, n, took);
                std::fflush(stdout);
            }
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "idem_cycle_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
