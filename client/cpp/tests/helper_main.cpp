// idem_test_helper: one request in its own OS process, for the
// cross-process tests.
//
//   idem_test_helper once|hang DSN KEY LEASE_MS HANDLER_MS TAG
//
// The handler records itself in effects(key, generation, who=TAG) on a
// connection of its own, then sleeps HANDLER_MS (once) or forever (hang,
// to be killed). Prints one line: status=.. ran=.. replayed=.. body=..
#include <idem/runner.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char **argv)
{
    if (argc != 7)
    {
        std::fprintf(stderr, "usage: %s once|hang DSN KEY LEASE_MS HANDLER_MS TAG\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1], dsn = argv[2], key = argv[3], tag = argv[6];
    const auto lease = std::chrono::milliseconds(std::atoll(argv[4]));
    const auto handler_ms = std::chrono::milliseconds(std::atoll(argv[5]));
    try
    {
        idem::simple_pool pool(dsn);
        // Unnamed statements behind a transaction-mode pooler (the parent's
        // environment, tests/suites/65_pooling.sh).
        idem::runner run(pool, idem::config::builder()
                                   .pooler_mode(std::getenv("PG_IDEM_TEST_POOLER") != nullptr)
                                   .lease(lease)
                                   .follower_wait_budget(std::chrono::seconds(10))
                                   .poll(std::chrono::milliseconds(10), std::chrono::milliseconds(100))
                                   .build());
        idem::request_view req;
        req.principal = "proc";
        req.method = "POST";
        req.target = "/jobs";
        req.idempotency_keys = {key};
        req.body = "same body";
        idem::run_result r = run.run(req, [&](const idem::claim_context &claim) {
            idem::pg::connection c(dsn);
            c.exec("INSERT INTO effects(key, generation, who) VALUES ($1, $2, $3)", key,
                   claim.generation(), tag);
            if (mode == "hang")
                for (;;)
                    std::this_thread::sleep_for(std::chrono::seconds(1));
            std::this_thread::sleep_for(handler_ms);
            return idem::response{201, {}, "made by " + tag};
        });
        std::printf("status=%d ran=%d replayed=%d body=%s\n", r.response.status, r.handler_ran ? 1 : 0,
                    r.replayed ? 1 : 0, r.response.body.c_str());
        return 0;
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "helper: %s\n", e.what());
        return 1;
    }
}
