// The README example: lease mode and in-transaction mode.
//
//   quickstart "host=/tmp dbname=app"      (a database with CREATE EXTENSION pg_idem)
#include <idem/runner.hpp>

#include <cstdio>

int main(int argc, char **argv)
{
    if (argc < 2)
    {
        std::fprintf(stderr, "usage: %s CONNINFO\n", argv[0]);
        return 2;
    }
    using namespace std::chrono_literals;

    // Connections come from the application: its pool, or this small one.
    idem::simple_pool pool(argv[1]);
    idem::runner run(pool, idem::config::builder()
                               .lease(10s)                     // renewed every lease/3 while the handler runs
                               .follower_wait_budget(2s)       // how long a duplicate waits for the first
                               .replay_header("X-Request-Id")  // replayed besides the default allowlist
                               .build());

    // What the HTTP layer extracted from the incoming request.
    const std::string body = R"({"amount": 42, "currency": "EUR"})";
    const std::string key = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    idem::request_view req;
    req.principal = "user-17";               // the authenticated actor
    req.method = "POST";
    req.target = "/payments?source=web";     // path and query
    req.idempotency_keys = {key};            // every Idempotency-Key field as received
    req.body = body;

    // Lease mode: runs at most once per key while it is cached; no
    // transaction is open while the handler runs.
    idem::run_result r = run.run(req, [&](const idem::claim_context &claim) {
        // ... call the payment provider, passing claim.generation() along as a fencing token ...
        return idem::response{201,
                              {{"Content-Type", "application/json"}, {"Location", "/payments/1"}},
                              R"({"id": 1, "generation": )" + std::to_string(claim.generation()) + "}"};
    });
    std::printf("lease mode: %d %s%s\n", r.response.status, r.response.body.c_str(),
                r.replayed ? " (replayed)" : "");

    // Exactly-once: the handler's writes and the stored response commit in
    // one transaction.
    {
        idem::pg::connection c(argv[1]);
        c.exec("CREATE TABLE IF NOT EXISTS quickstart_payments (amount int, generation bigint)");
    }
    req.target = "/payments/in-transaction";
    idem::run_result t = run.run_in_transaction(
        req, [&](idem::pg::transaction &tx, const idem::claim_context &claim) {
            tx.exec("INSERT INTO quickstart_payments VALUES ($1, $2)", 42, claim.generation());
            return idem::response{201, {{"Content-Type", "application/json"}}, R"({"id": 2})"};
        });
    std::printf("in-transaction: %d %s%s\n", t.response.status, t.response.body.c_str(),
                t.replayed ? " (replayed)" : "");
    return 0;
}
