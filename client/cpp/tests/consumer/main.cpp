// A program built against the installed pg_idem, the way an application is.
#include <idem/runner.hpp>

#include <cstdio>

int main()
{
    const idem::digest k = idem::cache_key("alice", "POST", "/orders?x=1", "k-1");
    if (idem::to_hex(k) != "acd67533843f1eb2b68b62cb6ff54254ca3675fc76682fc08486fee1a559dd29")
    {
        std::puts("consumer: wrong cache key");
        return 1;
    }
    try
    {
        idem::config::builder().lease(std::chrono::seconds(1)).renew_interval(std::chrono::seconds(2)).build();
        std::puts("consumer: invalid config accepted");
        return 1;
    }
    catch (const idem::config_error &)
    {
    }
    idem::simple_pool pool("host=/nonexistent-dir port=1 connect_timeout=1");
    idem::runner run(pool);
    idem::request_view req;
    req.principal = "alice";
    req.method = "POST";
    req.target = "/orders";
    req.idempotency_keys = {"k-1"};
    idem::run_result r = run.run(req, [](const idem::claim_context &) { return idem::response{}; });
    if (r.response.status != 503)
    {
        std::puts("consumer: expected 503 without a database");
        return 1;
    }
    std::puts("consumer ok");
    return 0;
}
