// A new-key request in each of the runner's modes, at CLIENTS clients,
// interleaved in rounds so that a loaded machine weighs on each alike:
// lease mode (run), run_fenced and run_in_transaction, whose BEGIN +
// claim and finalize + COMMIT go in two flights (libpq's pipeline mode).
// The handler writes one row (the application's effect) in every mode.
//
//   idem_modes_bench CONNINFO [CLIENTS=4] [SECONDS_PER_CELL=2] [ROUNDS=3]
//
// Prints requests/s, round trips per request and the ratio to lease mode.
#include <idem/runner.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class mode
{
    lease,
    fenced,
    in_transaction
};

// Hands out connections and counts the round trips made on them.
class counting_pool : public idem::connection_provider
{
public:
    explicit counting_pool(std::string dsn) : dsn_(std::move(dsn)) {}
    idem::connection_handle acquire() override
    {
        std::unique_ptr<idem::pg::connection> c;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (!idle_.empty())
            {
                c = std::move(idle_.back());
                idle_.pop_back();
            }
        }
        if (!c)
            c = std::make_unique<idem::pg::connection>(dsn_);
        const std::uint64_t start = c->round_trips();
        return idem::connection_handle(std::move(c), [this, start](std::unique_ptr<idem::pg::connection> back) {
            std::lock_guard<std::mutex> lk(mu_);
            trips_ += back->round_trips() - start;
            if (back->is_open() && back->status() == idem::pg::transaction_status::idle)
                idle_.push_back(std::move(back));
        });
    }
    std::uint64_t trips()
    {
        std::lock_guard<std::mutex> lk(mu_);
        return trips_;
    }

private:
    std::string dsn_;
    std::mutex mu_;
    std::vector<std::unique_ptr<idem::pg::connection>> idle_;
    std::uint64_t trips_ = 0;
};

struct cell_result
{
    double per_second = 0;
    double trips_per_request = 0;
};

cell_result cell(const std::string &dsn, mode m, int clients, std::chrono::milliseconds length, int round)
{
    counting_pool pool(dsn);
    idem::runner run(pool);
    std::atomic<long> done{0};
    std::atomic<bool> stop{false};
    const std::string tag = std::to_string(static_cast<int>(m)) + "-" + std::to_string(round) + "-" +
                            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    // The effect: one row in the request's transaction (its own one in
    // lease mode, which has none).
    auto tx_handler = [](idem::pg::transaction &tx, const idem::claim_context &ctx) {
        tx.exec("INSERT INTO bench_effects (generation) VALUES ($1)", ctx.generation());
        return idem::response{201, {}, "ok"};
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < clients; ++t)
        ts.emplace_back([&, t] {
            idem::pg::connection effects(dsn);
            auto lease_handler = [&](const idem::claim_context &ctx) {
                effects.exec("INSERT INTO bench_effects (generation) VALUES ($1)", ctx.generation());
                return idem::response{201, {}, "ok"};
            };
            idem::request_view req;
            req.principal = "bench";
            req.method = "POST";
            req.target = "/bench";
            req.body = "{}";
            long n = 0;
            while (!stop.load(std::memory_order_relaxed))
            {
                const std::string k = "new-" + tag + "-" + std::to_string(t) + "-" + std::to_string(n);
                req.idempotency_keys = {k};
                if (m == mode::lease)
                    run.run(req, lease_handler);
                else if (m == mode::fenced)
                    run.run_fenced(req, tx_handler);
                else
                    run.run_in_transaction(req, tx_handler);
                ++n;
            }
            done += n;
        });
    std::this_thread::sleep_for(length);
    stop = true;
    for (auto &t : ts)
        t.join();
    cell_result r;
    r.per_second = static_cast<double>(done.load()) / (static_cast<double>(length.count()) / 1000.0);
    r.trips_per_request = done.load() ? static_cast<double>(pool.trips()) / static_cast<double>(done.load()) : 0;
    return r;
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
    idem::pg::connection(dsn).exec(
        "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, generation bigint)");
    const std::pair<const char *, mode> modes[] = {
        {"lease", mode::lease}, {"fenced", mode::fenced}, {"in_transaction", mode::in_transaction}};
    std::map<std::string, double> rate, trips;
    for (int r = 0; r < rounds; ++r)
        for (const auto &[name, m] : modes)
        {
            const cell_result c = cell(dsn, m, clients, length, r);
            rate[name] += c.per_second;
            trips[name] += c.trips_per_request;
            std::fprintf(stderr, "round %d %s %.0f/s\n", r, name, c.per_second);
        }
    for (const auto &[name, m] : modes)
    {
        (void)m;
        // Round trips of the runner's connections; lease mode's handler
        // writes on a connection of its own (one more per request).
        std::printf("%-15s %7.0f req/s  %.2f round trips/request (runner's)  %.2f x lease\n", name,
                    rate[name] / rounds, trips[name] / rounds, rate[name] / rate["lease"]);
    }
    return 0;
}
