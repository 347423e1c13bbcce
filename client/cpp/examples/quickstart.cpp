// The README example: lease mode and in-transaction mode, as the
// application role (only GRANT idem_client; no CREATE privilege needed).
//
//   idem_quickstart "host=/tmp dbname=app user=my_service_role"
//
// The database needs pg_idem, and the in-transaction part writes to a table
// an administrator creates once (the program prints this when it is missing):
//
//   CREATE TABLE quickstart_payments (amount int, generation bigint);
//   GRANT INSERT ON quickstart_payments TO my_service_role;
//
// Exits 0 when both requests were answered 201 (run it twice: the second
// run's answers are replays), 1 otherwise, with the database error.
#include <idem/runner.hpp>

#include "prometheus_metrics.hpp"

#include <cstdio>
#include <exception>
#include <string>

// The database error behind a 503, for the operator.
static std::string error_text(const idem::run_result &r)
{
    if (!r.error)
        return "";
    try
    {
        std::rethrow_exception(r.error);
    }
    catch (const std::exception &e)
    {
        return e.what();
    }
    catch (...)
    {
        return "unknown error";
    }
}

// Print one answer; false when it is not the expected 201.
static bool report(const char *mode, const idem::run_result &r)
{
    std::printf("%s: %d %s%s\n", mode, r.response.status, r.response.body.c_str(),
                r.replayed ? " (replayed)" : "");
    const std::string error = error_text(r);
    if (!error.empty())
        std::fprintf(stderr, "%s: error: %s\n", mode, error.c_str());
    return r.response.status == 201;
}

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
    prometheus_metrics metrics;                                // counters for your /metrics endpoint
    idem::runner run(pool, idem::config::builder()
                               .lease(10s)                     // renewed every lease/3 while the handler runs
                               .follower_wait_budget(2s)       // how long a duplicate waits for the first
                               .replay_header("X-Request-Id")  // replayed besides the default allowlist
                               .build(),
                     &metrics);

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
    bool ok = report("lease mode", r);

    // Exactly-once: the handler's writes and the stored response commit in
    // one transaction. An exception of the handler (here: the table is
    // missing) rolls them back, puts the key in a short cooldown and
    // propagates.
    req.target = "/payments/in-transaction";
    try
    {
        idem::run_result t = run.run_in_transaction(
            req, [&](idem::pg::transaction &tx, const idem::claim_context &claim) {
                tx.exec("INSERT INTO quickstart_payments VALUES ($1, $2)", 42, claim.generation());
                return idem::response{201, {{"Content-Type", "application/json"}}, R"({"id": 2})"};
            });
        if (!report("in-transaction", t))
            ok = false;
    }
    catch (const idem::pg::sql_error &e)
    {
        ok = false;
        std::fprintf(stderr, "in-transaction: error: %s\n", e.what());
        if (e.sqlstate() == "42P01" || e.sqlstate() == "42501")  // no table, or no INSERT on it
            std::fprintf(stderr,
                         "in-transaction: as the database owner, create the table once:\n"
                         "  CREATE TABLE quickstart_payments (amount int, generation bigint);\n"
                         "  GRANT INSERT ON quickstart_payments TO <this role>;\n");
    }
    catch (const std::exception &e)
    {
        ok = false;
        std::fprintf(stderr, "in-transaction: error: %s\n", e.what());
    }
    std::printf("%s", metrics.render().c_str());
    return ok ? 0 : 1;
}
