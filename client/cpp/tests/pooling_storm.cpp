// The C++ runner's one-line setup with its defaults through a pooler
// (tests/pooling/storm_cpp.sh): DUPLICATES requests with one key at once,
// a handler of HANDLER_MS.
//
//   idem_pooling_storm CONNINFO lease|fenced DUPLICATES HANDLER_MS
//
// Prints one line:
//
//   runs=1 answered=20 status_201=20 status_503=0 ms=412
//
// and exits 0 when the handler ran exactly once and no request got 503;
// the suite compares ms with the same storm straight to the server.
#include <idem/runner.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

int main(int argc, char **argv)
{
    if (argc != 5)
    {
        std::fprintf(stderr, "usage: %s CONNINFO lease|fenced DUPLICATES HANDLER_MS\n", argv[0]);
        return 2;
    }
    const std::string conninfo = argv[1], mode = argv[2];
    const int duplicates = std::stoi(argv[3]);
    const auto handler_time = std::chrono::milliseconds(std::stoi(argv[4]));
    // The README's one-liner: a pool and a runner with the defaults.
    idem::simple_pool pool(conninfo);
    idem::runner run(pool);

    const std::string key =
        "storm-" + mode + "-" +
        std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
    std::atomic<int> runs{0};
    std::mutex mu;
    std::map<int, int> statuses;
    std::condition_variable go_cv;
    bool go = false;
    std::vector<std::thread> threads;
    for (int i = 0; i < duplicates; ++i)
        threads.emplace_back([&] {
            {
                std::unique_lock<std::mutex> lk(mu);
                go_cv.wait(lk, [&] { return go; });
            }
            idem::request_view req;
            req.principal = "storm";
            req.method = "POST";
            req.target = "/charges";
            req.idempotency_keys = {key};
            req.body = "{\"amount\":5}";
            idem::run_result r;
            if (mode == "fenced")
                r = run.run_fenced(req, [&](idem::pg::transaction &tx, const idem::claim_context &) {
                    runs++;
                    tx.exec("SELECT 1");
                    std::this_thread::sleep_for(handler_time);
                    return idem::response{201, {}, "charged"};
                });
            else
                r = run.run(req, [&](const idem::claim_context &) {
                    runs++;
                    std::this_thread::sleep_for(handler_time);
                    return idem::response{201, {}, "charged"};
                });
            std::lock_guard<std::mutex> lk(mu);
            statuses[r.response.status]++;
            if (r.response.status >= 500 && r.error)
            {
                try
                {
                    std::rethrow_exception(r.error);
                }
                catch (const std::exception &e)
                {
                    std::fprintf(stderr, "503: %s\n", e.what());
                }
            }
        });
    const auto t0 = std::chrono::steady_clock::now();
    {
        std::lock_guard<std::mutex> lk(mu);
        go = true;
    }
    go_cv.notify_all();
    for (auto &t : threads)
        t.join();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    int answered = 0;
    std::printf("runs=%d", runs.load());
    for (const auto &[status, n] : statuses)
    {
        answered += n;
        std::printf(" status_%d=%d", status, n);
    }
    std::printf(" answered=%d ms=%lld\n", answered, static_cast<long long>(ms.count()));
    return runs.load() == 1 && statuses.count(503) == 0 && answered == duplicates ? 0 : 1;
}
