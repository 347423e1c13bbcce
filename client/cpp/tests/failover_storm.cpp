// The C++ client through a primary failover (tests/failover/t/030_cpp_failover.pl).
//
//   idem_failover_storm CONNINFO CLIENTS LOG STOPFILE
//
// CONNINFO lists every node with target_session_attrs=read-write. Each of
// CLIENTS threads sends requests with keys of its own through
// runner::run_in_transaction, whose handler inserts one row into
// storm_effects in the claim's transaction. A request that gets no
// definite answer (the connection broke, no primary yet, an unknown
// commit: 503) is sent again with the same key, as an HTTP client would,
// until it gets one. Every definite answer is appended to LOG:
//
//   answered LABEL STATUS REPLAYED
//
// The test then checks on the new primary that every answered request has
// exactly one effect row and its response replays. Stops when STOPFILE exists.
#include <idem/runner.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

std::mutex log_mutex;

// Appends one answered request to the log.
void log_line(const std::string &path, const std::string &line)
{
    std::lock_guard<std::mutex> g(log_mutex);
    std::ofstream f(path, std::ios::app);
    f << line << "\n";
}

bool exists(const std::string &path)
{
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc != 5)
    {
        std::fprintf(stderr, "usage: %s CONNINFO CLIENTS LOG STOPFILE\n", argv[0]);
        return 2;
    }
    const std::string conninfo = argv[1], log = argv[3], stop = argv[4];
    const int clients = std::stoi(argv[2]);
    idem::simple_pool pool(conninfo);
    idem::runner run(pool, idem::config::builder().lease(30s).follower_wait_budget(2s).build());

    std::vector<std::thread> threads;
    for (int n = 0; n < clients; ++n)
        threads.emplace_back([&, n] {
            for (int i = 1; !exists(stop); ++i)
            {
                const std::string label = "cpp" + std::to_string(n) + "-" + std::to_string(i);
                const std::string body = "{\"label\":\"" + label + "\"}";
                idem::request_view req;
                req.principal = "storm";
                req.method = "POST";
                req.target = "/effects";
                req.idempotency_keys = {label};
                req.body = body;
                for (int attempt = 0; attempt < 600; ++attempt)
                {
                    try
                    {
                        idem::run_result r = run.run_in_transaction(
                            req, [&](idem::pg::transaction &tx, const idem::claim_context &claim) {
                                tx.exec("INSERT INTO storm_effects VALUES ($1, $2)", label, claim.generation());
                                return idem::response{201, {}, "effect " + label};
                            });
                        if (r.response.status < 500 && r.response.status != 409)
                        {
                            log_line(log, "answered " + label + " " + std::to_string(r.response.status) + " " +
                                              (r.replayed ? "replayed" : "ran"));
                            break;
                        }
                    }
                    catch (const std::exception &)
                    {
                        // No primary yet, or the connection broke: send the request again.
                    }
                    std::this_thread::sleep_for(100ms);
                }
            }
        });
    for (auto &t : threads)
        t.join();
    return 0;
}
