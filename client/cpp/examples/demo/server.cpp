// idem-demo-server: a small payments service whose POST /payments takes
// effect once per Idempotency-Key, guarded by pg_idem (the service of
// `make demo`).
//
//   idem-demo-server --port 8080 [--bind 127.0.0.1] [--dsn CONNINFO]
//                    [--wait-budget-ms 1000] [--cooldown-ms 1000] [--threads 64]
//                    [--port-file FILE] [--pid-file FILE]
//
// Without --dsn the libpq environment (PGHOST, PGPORT, PGDATABASE, ...)
// names the database, which must have the extension (CREATE EXTENSION
// pg_idem); the service creates its payments table. --port 0 takes any free
// port; --port-file receives the port once the socket listens.
//
//   POST /payments       body {"amount": <int>, "to": "<name>"}; headers
//                        Idempotency-Key and X-Demo-User (the payer) required.
//                        201 with the payment and a Location header; a
//                        duplicate gets the same answer plus
//                        Idempotent-Replayed: true.
//   GET  /payments/{id}  the payment, to the user who made it
//   GET  /stats          {"handler_executions": n, "payments": n, "outcomes": {...}}
//   GET  /healthz        200 "ok", no database
//
// Test hooks, not part of the key or of the request hash: X-Demo-Delay-Ms: N
// makes the handler sleep N ms, X-Demo-Fail: STATUS makes it answer STATUS
// (400-599) without inserting.
//
// The handler runs in runner::run_fenced: the claim commits first, so a
// duplicate sees the key in progress and, after the follower wait budget,
// answers 409 + Retry-After instead of blocking; the payment row and the
// stored response then commit in one transaction fenced by the claim.
#include <idem/runner.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

struct options
{
    std::string bind = "127.0.0.1";
    int port = 8080;
    std::string dsn;  // empty: the libpq environment
    milliseconds wait_budget{1000};
    milliseconds cooldown{1000};
    int threads = 64;
    std::string port_file;
    std::string pid_file;
};

// Prints the usage and leaves: the only way out of a bad command line.
[[noreturn]] void usage(const char *why)
{
    if (why)
        std::fprintf(stderr, "idem-demo-server: %s\n", why);
    std::fprintf(stderr,
                 "usage: idem-demo-server --port P [--bind ADDR] [--dsn CONNINFO]\n"
                 "       [--wait-budget-ms N] [--cooldown-ms N] [--threads N]\n"
                 "       [--port-file FILE] [--pid-file FILE]\n");
    std::exit(2);
}

// A whole decimal number within [lo, hi], or nothing: for flags and hook headers.
std::optional<long> parse_int(const std::string &s, long lo, long hi)
{
    if (s.empty() || s.size() > 12)
        return std::nullopt;
    long v = 0;
    for (char c : s)
    {
        if (c < '0' || c > '9')
            return std::nullopt;
        v = v * 10 + (c - '0');
    }
    if (v < lo || v > hi)
        return std::nullopt;
    return v;
}

// The command line, refused as a whole on the first bad flag.
options parse_options(int argc, char **argv)
{
    options o;
    for (int i = 1; i < argc; ++i)
    {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h")
            usage(nullptr);
        if (i + 1 >= argc)
            usage(("missing value after " + flag).c_str());
        const std::string value = argv[++i];
        auto number = [&](long lo, long hi) {
            auto v = parse_int(value, lo, hi);
            if (!v)
                usage(("bad value for " + flag + ": " + value).c_str());
            return *v;
        };
        if (flag == "--port")
            o.port = static_cast<int>(number(0, 65535));
        else if (flag == "--bind")
            o.bind = value;
        else if (flag == "--dsn")
            o.dsn = value;
        else if (flag == "--wait-budget-ms")
            o.wait_budget = milliseconds(number(1, 600000));
        else if (flag == "--cooldown-ms")
            o.cooldown = milliseconds(number(1, 600000));
        else if (flag == "--threads")
            o.threads = static_cast<int>(number(1, 1024));
        else if (flag == "--port-file")
            o.port_file = value;
        else if (flag == "--pid-file")
            o.pid_file = value;
        else
            usage(("unknown option " + flag).c_str());
    }
    return o;
}

// Counts the runner's outcomes for /stats.
class outcome_counters : public idem::metrics
{
public:
    void on_outcome(idem::outcome o) override { counts_[static_cast<std::size_t>(o)]++; }
    // {"replay": n, ...} for /stats.
    json to_json() const
    {
        json j = json::object();
        for (std::size_t i = 0; i < counts_.size(); ++i)
            j[idem::to_string(static_cast<idem::outcome>(i))] = counts_[i].load();
        return j;
    }

private:
    std::array<std::atomic<std::uint64_t>, 8> counts_{};  // one per idem::outcome
};

// A request refused before the runner sees it, with its answer.
struct refusal
{
    idem::response answer;
};

// Throws the problem+json refusal of a request.
[[noreturn]] void refuse(int status, const char *title, std::string detail)
{
    idem::problem p;
    p.status = status;
    p.title = title;
    p.detail = std::move(detail);
    throw refusal{idem::make_problem_response(p)};
}

// Copies a runner (or our own) response onto the wire.
void send(httplib::Response &res, const idem::response &r)
{
    res.status = r.status;
    for (const auto &h : r.headers)
        res.set_header(h.name.c_str(), h.value);
    res.body = r.body;
}

// The payer: the demo's stand-in for an authenticated principal.
std::string principal_of(const httplib::Request &req)
{
    std::string user = req.get_header_value("X-Demo-User");
    if (user.empty())
        refuse(401, "missing user", "The X-Demo-User header names the payer; it is required.");
    if (user.size() > 100)
        refuse(400, "invalid user", "X-Demo-User is at most 100 bytes.");
    return user;
}

// An optional numeric test-hook header within [lo, hi]; 0 when absent.
long hook(const httplib::Request &req, const char *name, long lo, long hi)
{
    if (!req.has_header(name))
        return 0;
    auto v = parse_int(req.get_header_value(name), lo, hi);
    if (!v)
        refuse(400, "invalid test hook",
               std::string(name) + " must be a whole number from " + std::to_string(lo) + " to " +
                   std::to_string(hi) + ".");
    return *v;
}

struct payment_request
{
    std::int64_t amount = 0;
    std::string to;
};

// The body, validated before any key is claimed: a malformed request
// neither runs nor takes its key.
payment_request parse_payment(const httplib::Request &req)
{
    const std::string type = req.get_header_value("Content-Type");
    if (!type.empty() && type.rfind("application/json", 0) != 0)
        refuse(415, "unsupported media type", "The body must be application/json.");
    const json j = json::parse(req.body, nullptr, false);
    const char *shape = R"(The body must be a JSON object {"amount": <integer>, "to": "<name>"}.)";
    if (j.is_discarded() || !j.is_object())
        refuse(400, "invalid body", shape);
    for (const auto &item : j.items())
        if (item.key() != "amount" && item.key() != "to")
            refuse(400, "invalid body", "Unknown member \"" + item.key() + "\". " + shape);
    payment_request p;
    const auto amount = j.find("amount");
    if (amount == j.end() || !amount->is_number_integer())
        refuse(400, "invalid amount", "\"amount\" must be an integer number of cents.");
    p.amount = amount->get<std::int64_t>();
    if (p.amount < 1 || p.amount > 1000000000)
        refuse(400, "invalid amount", "\"amount\" must be from 1 to 1000000000.");
    const auto to = j.find("to");
    if (to == j.end() || !to->is_string() || to->get<std::string>().empty() ||
        to->get<std::string>().size() > 100)
        refuse(400, "invalid recipient", "\"to\" must be a name of 1 to 100 bytes.");
    p.to = to->get<std::string>();
    return p;
}

// A payment row as the API shows it.
json payment_json(std::int64_t id, std::int64_t amount, const std::string &to, const std::string &user)
{
    return json{{"id", id}, {"amount", amount}, {"to", to}, {"user", user}};
}

// The routes' logic, sharing one runner and one pool between request threads.
class service
{
public:
    // A 10 s lease renewed while the handler runs; the short wait budget and
    // cooldown come from the command line.
    service(idem::connection_provider &pool, const options &o)
        : pool_(pool),
          run_(pool,
               idem::config::builder()
                   .lease(std::chrono::seconds(10))
                   .follower_wait_budget(o.wait_budget)
                   .failure_cooldown(o.cooldown)
                   .retry_after(std::chrono::seconds(1))
                   .build(),
               &counters_)
    {
    }

    void check() const { run_.check(); }

    // POST /payments: validate, then run the insert once per key.
    idem::response create_payment(const httplib::Request &req)
    {
        const std::string user = principal_of(req);
        const long delay_ms = hook(req, "X-Demo-Delay-Ms", 0, 60000);
        const long fail_status = hook(req, "X-Demo-Fail", 400, 599);
        const payment_request body = parse_payment(req);

        std::vector<std::string> keys;
        for (std::size_t i = 0, n = req.get_header_value_count("Idempotency-Key"); i < n; ++i)
            keys.push_back(req.get_header_value("Idempotency-Key", i));
        idem::request_view view;
        view.principal = user;
        view.method = "POST";
        view.target = req.target;
        view.idempotency_keys.assign(keys.begin(), keys.end());
        view.body = req.body;
        view.key_required = true;

        const idem::run_result r = run_.run_fenced(
            view, [&](idem::pg::transaction &tx, const idem::claim_context &claim) {
                executions_.fetch_add(1);
                if (delay_ms > 0)
                    std::this_thread::sleep_for(milliseconds(delay_ms));
                if (fail_status != 0)
                {
                    idem::problem p;
                    p.status = static_cast<int>(fail_status);
                    p.title = "demo failure";
                    p.detail = "X-Demo-Fail asked for this status; nothing was written.";
                    return idem::make_problem_response(p);
                }
                const std::int64_t id =
                    tx.exec("INSERT INTO payments (principal, amount, recipient, generation) "
                            "VALUES ($1, $2, $3, $4) RETURNING id",
                            user, body.amount, body.to, claim.generation())
                        .get_int(0, 0);
                return idem::response{201,
                                      {{"Content-Type", "application/json"},
                                       {"Location", "/payments/" + std::to_string(id)}},
                                      payment_json(id, body.amount, body.to, user).dump()};
            });
        std::fprintf(stderr, "POST %s user=%s key=%s -> %d %s%s\n", req.target.c_str(), user.c_str(),
                     keys.empty() ? "-" : keys.front().c_str(), r.response.status,
                     idem::to_string(r.outcome), r.handler_ran ? " (ran)" : "");
        return r.response;
    }

    // GET /payments/{id}: only the user who made it sees it.
    idem::response show_payment(const httplib::Request &req, std::int64_t id)
    {
        const std::string user = principal_of(req);
        idem::connection_handle conn = pool_.acquire();
        const idem::pg::result r =
            conn->exec("SELECT amount, recipient FROM payments WHERE id = $1 AND principal = $2", id, user);
        if (r.empty())
            refuse(404, "not found", "No payment " + std::to_string(id) + " of this user.");
        return idem::response{200,
                              {{"Content-Type", "application/json"}},
                              payment_json(id, r.get_int(0, 0), r.get_text(0, 1), user).dump()};
    }

    // GET /stats: what the storm compares before and after each case.
    idem::response stats()
    {
        idem::connection_handle conn = pool_.acquire();
        const std::int64_t rows = conn->exec("SELECT count(*) FROM payments").get_int(0, 0);
        const json j = {{"handler_executions", executions_.load()},
                        {"payments", rows},
                        {"outcomes", counters_.to_json()}};
        return idem::response{200, {{"Content-Type", "application/json"}}, j.dump()};
    }

private:
    idem::connection_provider &pool_;
    outcome_counters counters_;
    idem::runner run_;
    std::atomic<std::uint64_t> executions_{0};
};

// Checks the extension and creates the payments table; false, with a
// message, when the database is not usable.
bool prepare_database(idem::connection_provider &pool)
{
    try
    {
        idem::connection_handle conn = pool.acquire();
        if (conn->exec("SELECT 1 FROM pg_extension WHERE extname = 'pg_idem'").empty())
        {
            std::fprintf(stderr,
                         "idem-demo-server: the extension is missing in this database; "
                         "run CREATE EXTENSION pg_idem first\n");
            return false;
        }
        conn->exec("CREATE TABLE IF NOT EXISTS payments ("
                   " id bigserial PRIMARY KEY,"
                   " principal text NOT NULL,"
                   " amount bigint NOT NULL CHECK (amount > 0),"
                   " recipient text NOT NULL,"
                   " generation bigint NOT NULL,"
                   " created_at timestamptz NOT NULL DEFAULT now())");
        return true;
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "idem-demo-server: cannot prepare the database: %s\n", e.what());
        return false;
    }
}

// Writes a small file in one step (temporary name, then rename), so a
// reader never sees it half written.
bool write_file(const std::string &path, const std::string &text)
{
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp);
        f << text << '\n';
        if (!f)
            return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Runs a route, turning refusals and unexpected errors into answers.
template <typename F>
void answer(httplib::Response &res, F &&route)
{
    try
    {
        send(res, route());
    }
    catch (const refusal &r)
    {
        send(res, r.answer);
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "idem-demo-server: request failed: %s\n", e.what());
        idem::problem p;
        p.status = 500;
        p.title = "internal error";
        p.detail = "The request failed; the server log has the reason.";
        send(res, idem::make_problem_response(p));
    }
}

}  // namespace

int main(int argc, char **argv)
{
    const options opt = parse_options(argc, argv);

    // SIGINT/SIGTERM go to one thread that stops the server cleanly; every
    // other thread inherits the blocked mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    idem::simple_pool pool(opt.dsn, 16);
    service svc(pool, opt);
    try
    {
        // The start-up check: waits for a server that is still coming up,
        // refuses to start on one this runner cannot use (a role, database
        // or extension missing, no EXECUTE), saying what to fix.
        svc.check();
    }
    catch (const idem::setup_error &e)
    {
        std::fprintf(stderr, "idem-demo-server: %s\n", e.what());
        return 1;
    }
    if (!prepare_database(pool))
        return 1;

    httplib::Server http;
    const int threads = opt.threads;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
    http.set_payload_max_length(1024 * 1024);
    http.Post("/payments", [&](const httplib::Request &req, httplib::Response &res) {
        answer(res, [&] { return svc.create_payment(req); });
    });
    http.Get(R"(/payments/(\d{1,18}))", [&](const httplib::Request &req, httplib::Response &res) {
        answer(res, [&] { return svc.show_payment(req, std::stoll(req.matches[1].str())); });
    });
    http.Get("/stats", [&](const httplib::Request &, httplib::Response &res) {
        answer(res, [&] { return svc.stats(); });
    });
    http.Get("/healthz", [](const httplib::Request &, httplib::Response &res) {
        res.set_content("ok\n", "text/plain");
    });

    int port = opt.port;
    if (port == 0)
        port = http.bind_to_any_port(opt.bind);
    else if (!http.bind_to_port(opt.bind, port))
        port = -1;
    if (port <= 0)
    {
        std::fprintf(stderr, "idem-demo-server: cannot listen on %s:%d: %s\n", opt.bind.c_str(),
                     opt.port, std::strerror(errno));
        return 1;
    }
    if ((!opt.pid_file.empty() && !write_file(opt.pid_file, std::to_string(getpid()))) ||
        (!opt.port_file.empty() && !write_file(opt.port_file, std::to_string(port))))
    {
        std::fprintf(stderr, "idem-demo-server: cannot write the pid or port file\n");
        return 1;
    }
    std::printf("idem-demo-server listening on http://%s:%d (wait budget %lld ms, cooldown %lld ms)\n",
                opt.bind.c_str(), port, static_cast<long long>(opt.wait_budget.count()),
                static_cast<long long>(opt.cooldown.count()));
    std::fflush(stdout);

    std::thread([&http, stop_signals] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        http.stop();
    }).detach();
    http.listen_after_bind();
    std::printf("idem-demo-server stopped\n");
    return 0;
}
