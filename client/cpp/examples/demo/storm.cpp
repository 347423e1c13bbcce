// idem-demo-storm: the duplicate-request storm of `make demo`, sent to a
// running idem-demo-server, printed as a table of what should happen and
// what did. Exits 1 if any expectation fails.
//
//   idem-demo-storm --port P [--host 127.0.0.1] [--concurrency 50]
//
// Every retrying request goes through idem::sender::retry_policy: one
// UUIDv7 key per logical payment, the same key on every retry, Retry-After
// honoured. The server must run with a 1 s follower wait budget and a 1 s
// failure cooldown (storm.sh starts it that way).
#include <idem/retry_policy.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct options
{
    std::string host = "127.0.0.1";
    int port = 0;
    int concurrency = 50;
};

// Prints the usage and leaves: the only way out of a bad command line.
[[noreturn]] void usage(const char *why)
{
    if (why)
        std::fprintf(stderr, "idem-demo-storm: %s\n", why);
    std::fprintf(stderr, "usage: idem-demo-storm --port P [--host H] [--concurrency N]\n");
    std::exit(2);
}

// The command line; the port is required.
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
        char *end = nullptr;
        const long n = std::strtol(value.c_str(), &end, 10);
        const bool numeric = !value.empty() && *end == '\0';
        if (flag == "--host")
            o.host = value;
        else if (flag == "--port" && numeric && n > 0 && n < 65536)
            o.port = static_cast<int>(n);
        else if (flag == "--concurrency" && numeric && n >= 2 && n <= 500)
            o.concurrency = static_cast<int>(n);
        else
            usage(("bad option " + flag + " " + value).c_str());
    }
    if (o.port == 0)
        usage("--port is required");
    return o;
}

// What one HTTP exchange gave.
struct reply
{
    bool answered = false;  // a response was read
    std::string error;      // the transport error otherwise
    int status = 0;
    std::string body;
    std::string location;
    std::optional<std::string> retry_after;
    bool replayed = false;
    steady::time_point at;  // when it arrived (or failed)

    // What the retry policy needs to decide.
    idem::sender::attempt_result result() const
    {
        if (!answered)
            return idem::sender::attempt_result::transport_error();
        return idem::sender::attempt_result::response(status, retry_after);
    }
};

// Counters from GET /stats.
struct stats
{
    long long executions = 0;
    long long payments = 0;
};

// The server, seen through cpp-httplib.
class api
{
public:
    explicit api(const options &o) : host_(o.host), port_(o.port) {}

    // A fresh connection: each case controls its own timeouts.
    std::unique_ptr<httplib::Client> client(milliseconds read_timeout = 15s) const
    {
        auto c = std::make_unique<httplib::Client>(host_, port_);
        c->set_connection_timeout(5s);
        c->set_read_timeout(read_timeout);
        return c;
    }

    // POST /payments as `user`, with `key` unless it is empty.
    static reply post(httplib::Client &c, const std::string &user, const std::string &key,
                      const std::string &body, httplib::Headers extra = {})
    {
        extra.emplace("X-Demo-User", user);
        if (!key.empty())
            extra.emplace("Idempotency-Key", key);
        reply r;
        auto res = c.Post("/payments", extra, body, "application/json");
        r.at = steady::now();
        if (!res)
        {
            r.error = httplib::to_string(res.error());
            return r;
        }
        r.answered = true;
        r.status = res->status;
        r.body = res->body;
        r.location = res->get_header_value("Location");
        if (res->has_header("Retry-After"))
            r.retry_after = res->get_header_value("Retry-After");
        r.replayed = res->get_header_value("Idempotent-Replayed") == "true";
        return r;
    }

    // The same on a connection of its own.
    reply post(const std::string &user, const std::string &key, const std::string &body,
               httplib::Headers extra = {}, milliseconds read_timeout = 15s) const
    {
        return post(*client(read_timeout), user, key, body, std::move(extra));
    }

    // GET /stats: the cases compare it before and after.
    stats read_stats() const
    {
        auto res = client()->Get("/stats");
        if (!res || res->status != 200)
            throw std::runtime_error("GET /stats failed");
        const json j = json::parse(res->body);
        return stats{j.at("handler_executions").get<long long>(), j.at("payments").get<long long>()};
    }

private:
    std::string host_;
    int port_;
};

// The table: rows are printed as the cases finish.
class table
{
public:
    // Prints the header row.
    table()
    {
        std::printf("\n%-50s  %-30s  %-30s  %s\n", "case", "expected", "got", "ok");
        std::printf("%-50s  %-30s  %-30s  %s\n", std::string(50, '-').c_str(),
                    std::string(30, '-').c_str(), std::string(30, '-').c_str(), "--");
    }
    // A row whose verdict is expected == got.
    void row(const std::string &what, const std::string &expected, const std::string &got)
    {
        row(what, expected, got, expected == got);
    }
    void row(const std::string &what, const std::string &expected, const std::string &got, bool ok)
    {
        ++rows_;
        if (!ok)
            ++failed_;
        std::printf("%-50s  %-30s  %-30s  %s\n", what.c_str(), expected.c_str(), got.c_str(),
                    ok ? "ok" : "FAIL");
        std::fflush(stdout);
    }
    // For the summary line.
    int rows() const { return rows_; }
    int failed() const { return failed_; }

private:
    int rows_ = 0;
    int failed_ = 0;
};

// "201", "201, replayed", "409 + Retry-After: 1", "no response (Read)".
std::string describe(const reply &r)
{
    if (!r.answered)
        return "no response (" + r.error + ")";
    std::string s = std::to_string(r.status);
    if (r.retry_after)
        s += " + Retry-After: " + *r.retry_after;
    if (r.replayed)
        s += ", replayed";
    return s;
}

// "runs / rows" between two /stats readings.
std::string delta(const stats &before, const stats &after)
{
    return std::to_string(after.executions - before.executions) + " / " +
           std::to_string(after.payments - before.payments);
}

// The payment id in a 201 body, or -1.
long long payment_id(const reply &r)
{
    const json j = json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("id") && j["id"].is_number_integer())
        return j["id"].get<long long>();
    return -1;
}

// A JSON body for POST /payments.
std::string payment(long long amount, const std::string &to)
{
    return json{{"amount", amount}, {"to", to}}.dump();
}

// The senders' policy: 5 attempts, 100 ms doubling to 2 s, half of it jitter.
idem::sender::retry_policy make_policy()
{
    idem::sender::settings s;
    s.max_attempts = 5;
    s.initial_backoff = 100ms;
    s.max_backoff = 2s;
    s.jitter = 0.5;
    s.max_retry_after = 10s;
    return idem::sender::retry_policy(s);
}

// A gate the storm's threads wait at, so their requests leave together.
class gate
{
public:
    // Blocks until open().
    void wait()
    {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [this] { return open_; });
    }
    // Lets every waiting thread go at once.
    void open()
    {
        {
            std::lock_guard<std::mutex> lock(m_);
            open_ = true;
        }
        cv_.notify_all();
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    bool open_ = false;
};

// N concurrent POSTs with one key: one execution, N identical answers.
void storm_case(const api &server, const idem::sender::retry_policy &policy, table &t, int n)
{
    const std::string key = idem::uuid_v7();
    const std::string body = payment(4200, "bob");
    // Connect first (the listen backlog is short), then send together.
    std::vector<std::unique_ptr<httplib::Client>> clients;
    for (int i = 0; i < n; ++i)
    {
        clients.push_back(server.client());
        clients.back()->set_keep_alive(true);
        clients.back()->Get("/healthz");
    }
    const stats before = server.read_stats();
    std::vector<reply> finals(static_cast<std::size_t>(n));
    std::vector<unsigned> attempts(static_cast<std::size_t>(n));
    gate start;
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            start.wait();
            const auto res = policy.run(key, [&](const std::string &k, unsigned) {
                finals[i] = api::post(*clients[i], "alice", k, body);
                return finals[i].result();
            });
            attempts[i] = res.attempts;
        });
    start.open();
    for (auto &th : threads)
        th.join();
    clients.clear();
    const stats after = server.read_stats();

    int created = 0, replayed = 0, retried = 0;
    std::set<std::string> answers;
    for (int i = 0; i < n; ++i)
    {
        created += finals[i].status == 201;
        replayed += finals[i].replayed;
        retried += attempts[i] > 1;
        answers.insert(std::to_string(finals[i].status) + "\n" + finals[i].location + "\n" + finals[i].body);
    }
    const std::string N = std::to_string(n);
    t.row(N + " concurrent POSTs, one key: answers", N + " x 201, identical",
          std::to_string(created) + " x 201, " +
              (answers.size() == 1 ? std::string("identical") : std::to_string(answers.size()) + " different"));
    t.row("  marked Idempotent-Replayed: true", std::to_string(n - 1), std::to_string(replayed));
    t.row("  handler runs / payment rows", "1 / 1", delta(before, after));
    if (retried > 0)
        std::printf("  (%d of the %d senders got 409 + Retry-After first and retried)\n", retried, n);
}

// The first response is lost (client timeout shorter than the handler); the
// retry with the same key gets the stored answer.
void lost_response_case(const api &server, const idem::sender::retry_policy &policy, table &t)
{
    const stats before = server.read_stats();
    std::vector<reply> seen;
    const auto res = policy.run([&](const std::string &key, unsigned attempt) {
        // The same request every time; only the first attempt gives up early.
        seen.push_back(server.post("alice", key, payment(1500, "carol"), {{"X-Demo-Delay-Ms", "1000"}},
                                   attempt == 1 ? 300ms : 15s));
        return seen.back().result();
    });
    const stats after = server.read_stats();
    t.row("lost response: 1st attempt, client timeout 300 ms", "no response (Read)", describe(seen.front()));
    t.row("  retry with the same key", "201, replayed", describe(seen.back()),
          describe(seen.back()) == "201, replayed" && res.attempts >= 2);
    t.row("  handler runs / payment rows", "1 / 1", delta(before, after));
}

// The same key with another body is refused, not run.
void mismatch_case(const api &server, const idem::sender::retry_policy &policy, table &t)
{
    const stats before = server.read_stats();
    const std::string key = idem::uuid_v7();
    reply first, second;
    policy.run(key, [&](const std::string &k, unsigned) {
        first = server.post("alice", k, payment(700, "dave"));
        return first.result();
    });
    policy.run(key, [&](const std::string &k, unsigned) {
        second = server.post("alice", k, payment(7000, "dave"));
        return second.result();
    });
    const stats after = server.read_stats();
    t.row("same key, another body: first request", "201", describe(first));
    t.row("  same key, amount 7000 instead of 700", "422", describe(second));
    t.row("  handler runs / payment rows", "1 / 1", delta(before, after));
}

// A handler slower than the follower wait: the duplicate gets 409 +
// Retry-After, waits that long, and then gets the replay. The duplicate is
// sent once the original's handler runs (the server counts it at its start),
// and the handler's 3 s leave the duplicate's 1 s wait about 2 s of slack on
// a loaded machine.
void slow_handler_case(const api &server, const idem::sender::retry_policy &policy, table &t)
{
    const stats before = server.read_stats();
    const std::string key = idem::uuid_v7();
    const std::string body = payment(900, "erin");
    reply original;
    std::thread first([&] { original = server.post("alice", key, body, {{"X-Demo-Delay-Ms", "3000"}}); });
    const auto until = steady::now() + 30s;
    while (server.read_stats().executions == before.executions && steady::now() < until)
        std::this_thread::sleep_for(10ms);
    std::vector<reply> seen;
    const auto res = policy.run(key, [&](const std::string &k, unsigned) {
        seen.push_back(server.post("alice", k, body));
        return seen.back().result();
    });
    first.join();
    const stats after = server.read_stats();
    t.row("slow handler (3 s), duplicate while it runs", "409 + Retry-After: 1", describe(seen.front()));
    const bool waited = seen.size() >= 2 && seen[1].at - seen[0].at >= 1s;
    t.row("  duplicate retries after Retry-After", "201, replayed", describe(seen.back()),
          describe(seen.back()) == "201, replayed" && waited && res.attempts >= 2);
    t.row("  original request", "201", describe(original));
    t.row("  handler runs / payment rows", "1 / 1", delta(before, after));
}

// A handler failing with 503 puts the key in cooldown: a retry within it
// does not run; the retry after Retry-After runs once.
void failure_case(const api &server, const idem::sender::retry_policy &policy, table &t)
{
    const stats before = server.read_stats();
    std::vector<reply> seen;
    std::vector<long long> ran;  // handler executions per attempt
    const auto res = policy.run([&](const std::string &key, unsigned attempt) {
        httplib::Headers hooks;
        if (attempt == 1)
            hooks.emplace("X-Demo-Fail", "503");
        const stats b = server.read_stats();
        seen.push_back(server.post("alice", key, payment(300, "frank"), hooks));
        ran.push_back(server.read_stats().executions - b.executions);
        return seen.back().result();
    });
    const stats after = server.read_stats();
    auto attempt_row = [&](std::size_t i, const std::string &what, const std::string &expected) {
        const std::string got =
            i < seen.size() ? describe(seen[i]) + (ran[i] ? ", ran" : ", not run") : "no attempt";
        t.row(what, expected, got);
    };
    attempt_row(0, "handler fails: X-Demo-Fail: 503", "503, ran");
    attempt_row(1, "  retry at once, within the 1 s cooldown", "503 + Retry-After: 1, not run");
    attempt_row(2, "  retry after Retry-After, without the hook", "201, ran");
    t.row("  attempts / handler runs / payment rows", "3 / 2 / 1",
          std::to_string(res.attempts) + " / " + delta(before, after));
}

// Two users sending the same key: two payments, and each replay is its own.
void two_users_case(const api &server, const idem::sender::retry_policy &policy, table &t)
{
    const stats before = server.read_stats();
    const std::string key = idem::uuid_v7();
    const std::string body = payment(100, "grace");
    auto send = [&](const std::string &user) {
        reply r;
        policy.run(key, [&](const std::string &k, unsigned) {
            r = server.post(user, k, body);
            return r.result();
        });
        return r;
    };
    const reply alice = send("alice");
    const reply bob = send("bob");
    const reply again = send("alice");
    const stats after = server.read_stats();
    t.row("two users, one key: alice", "201", describe(alice));
    t.row("  bob, same key and body", "201, another payment", describe(bob) +
          (payment_id(bob) != payment_id(alice) && payment_id(bob) > 0 ? ", another payment" : ", same payment"));
    t.row("  alice again", "201, replayed, hers", describe(again) +
          (again.body == alice.body ? ", hers" : ", not hers"));
    t.row("  handler runs / payment rows", "2 / 2", delta(before, after));
}

// Requests refused before any key is claimed.
void validation_case(const api &server, table &t)
{
    const stats before = server.read_stats();
    const std::string key = idem::uuid_v7();
    auto shape = [](const reply &r) {
        return describe(r) + (r.body.find("\"status\"") != std::string::npos ? " problem" : "");
    };
    t.row("no Idempotency-Key", "400 problem", shape(server.post("alice", "", payment(5, "heidi"))));
    t.row("body is not JSON", "400 problem", shape(server.post("alice", key, "amount=5")));
    t.row("amount is not an integer", "400 problem",
          shape(server.post("alice", key, R"({"amount": "5", "to": "heidi"})")));
    t.row("  handler runs / payment rows", "0 / 0", delta(before, server.read_stats()));
}

}  // namespace

int main(int argc, char **argv)
{
    const options opt = parse_options(argc, argv);
    const api server(opt);
    const auto policy = make_policy();
    const auto t0 = steady::now();

    // The server may still be starting.
    for (int i = 0;; ++i)
    {
        auto res = server.client(1s)->Get("/healthz");
        if (res && res->status == 200)
            break;
        if (i == 100)
        {
            std::fprintf(stderr, "idem-demo-storm: no answer from %s:%d\n", opt.host.c_str(), opt.port);
            return 1;
        }
        std::this_thread::sleep_for(100ms);
    }

    table t;
    try
    {
        storm_case(server, policy, t, opt.concurrency);
        lost_response_case(server, policy, t);
        mismatch_case(server, policy, t);
        slow_handler_case(server, policy, t);
        failure_case(server, policy, t);
        two_users_case(server, policy, t);
        validation_case(server, t);
    }
    catch (const std::exception &e)
    {
        std::printf("storm stopped: %s\n", e.what());
        return 1;
    }
    const double secs = std::chrono::duration<double>(steady::now() - t0).count();
    std::printf("\n%d of %d expectations met in %.1f s\n", t.rows() - t.failed(), t.rows(), secs);
    return t.failed() == 0 ? 0 : 1;
}
