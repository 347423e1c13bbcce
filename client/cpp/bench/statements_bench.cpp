// What the runner's statement preparation costs on a connection straight
// to the server: new-key requests (claim + finalize) and replays through
// runner::run with named, unnamed and automatic (the default) statements,
// interleaved in rounds so that a loaded machine weighs on each alike.
//
//   idem_statements_bench CONNINFO [CLIENTS=4] [SECONDS_PER_CELL=2] [ROUNDS=3]
//
// Prints requests/s per preparation and kind, and each one's ratio to named.
#include <idem/runner.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using idem::pg::preparation;

namespace {

double cell(const std::string &dsn, preparation how, bool replay, int clients,
            std::chrono::milliseconds length, int round)
{
    idem::simple_pool pool(dsn, static_cast<std::size_t>(clients) + 2);
    idem::runner run(pool, idem::config::builder().prepared_statements(how).build());
    std::atomic<long> done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    const std::string tag = std::to_string(static_cast<int>(how)) + "-" + std::to_string(round) + "-" +
                            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    auto handler = [](const idem::claim_context &) { return idem::response{201, {}, "ok"}; };
    for (int t = 0; t < clients; ++t)
        ts.emplace_back([&, t] {
            idem::request_view req;
            req.principal = "bench";
            req.method = "POST";
            req.target = "/bench";
            req.body = "{}";
            const std::string fixed = "replay-" + tag + "-" + std::to_string(t);
            req.idempotency_keys = {fixed};
            run.run(req, handler);  // warms the connection (and stores the replayed key)
            long n = 0;
            while (!stop.load(std::memory_order_relaxed))
            {
                std::string k = replay ? fixed : "new-" + tag + "-" + std::to_string(t) + "-" + std::to_string(n);
                req.idempotency_keys = {k};
                run.run(req, handler);
                ++n;
            }
            done += n;
        });
    std::this_thread::sleep_for(length);
    stop = true;
    for (auto &t : ts)
        t.join();
    return static_cast<double>(done.load()) / (static_cast<double>(length.count()) / 1000.0);
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc < 2)
    {
        std::fprintf(stderr, "usage: %s CONNINFO [CLIENTS] [SECONDS_PER_CELL] [ROUNDS]\n", argv[0]);
        return 2;
    }
    const std::string dsn = argv[1];
    const int clients = argc > 2 ? std::stoi(argv[2]) : 4;
    const auto length = std::chrono::milliseconds(argc > 3 ? std::stoi(argv[3]) * 1000 : 2000);
    const int rounds = argc > 4 ? std::stoi(argv[4]) : 3;
    const std::pair<const char *, preparation> kinds[] = {
        {"named", preparation::named}, {"unnamed", preparation::unnamed}, {"automatic", preparation::automatic}};
    std::map<std::string, double> sum;
    for (int r = 0; r < rounds; ++r)
        for (bool replay : {false, true})
            for (const auto &[name, how] : kinds)
                sum[std::string(replay ? "replay " : "new-key ") + name] +=
                    cell(dsn, how, replay, clients, length, r);
    for (const char *kind : {"new-key", "replay"})
    {
        const double named = sum[std::string(kind) + " named"];
        for (const auto &[name, how] : kinds)
        {
            (void)how;
            const double v = sum[std::string(kind) + " " + name];
            std::printf("%-8s %-9s %8.0f req/s  %.2f x named\n", kind, name, v / rounds, v / named);
        }
    }
    return 0;
}
