// Inbox consumers and outbox drainers killed with SIGKILL (or stalled past
// their lease) in processes of their own (idem_messages_helper), against a
// real server: every effect happens exactly once, nothing is lost, the
// attempt cap holds, leased events come back after the lease, and a late
// ack changes nothing. The Python and Node
// clients run the same scenarios (test_messaging_processes.py,
// messaging-processes.test.js).
#include "messages_test_support.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
using idem_msg_test::dsn;
using idem_msg_test::query;
using clk = std::chrono::steady_clock;

namespace {

constexpr const char *session_ended = "consumer session ended during the attempt";

// An idem_messages_helper process with its stdin and stdout as pipes.
class helper
{
public:
    explicit helper(std::vector<std::string> args)
    {
        int out[2], in[2];
        if (pipe(out) != 0 || pipe(in) != 0)
            throw std::runtime_error("pipe failed");
        args.insert(args.begin(), IDEM_MESSAGES_HELPER);
        std::vector<char *> argv;
        for (std::string &a : args)
            argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_ = fork();
        if (pid_ == 0)
        {
            dup2(out[1], STDOUT_FILENO);
            dup2(in[0], STDIN_FILENO);
            close(out[0]);
            close(out[1]);
            close(in[0]);
            close(in[1]);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(out[1]);
        close(in[0]);
        out_ = out[0];
        in_ = in[1];
    }
    helper(const helper &) = delete;
    helper &operator=(const helper &) = delete;
    ~helper()
    {
        if (pid_ > 0)
            kill();
        close(out_);
        close(in_);
    }

    // Reads lines until one satisfies pred (true), the end or the deadline.
    bool wait_for(const std::function<bool(const std::string &)> &pred, std::chrono::seconds timeout = 60s)
    {
        for (const std::string &l : lines)
            if (pred(l))
                return true;
        const auto until = clk::now() + timeout;
        while (clk::now() < until)
        {
            std::optional<std::string> l = next_line(until);
            if (!l)
                return false;
            lines.push_back(*l);
            if (pred(*l))
                return true;
        }
        return false;
    }

    void kill()
    {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

    // Reads to the end; the exit status.
    int finish()
    {
        wait_for([](const std::string &) { return false; }, 120s);
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }

    void send(const std::string &line)
    {
        const std::string l = line + "\n";
        if (write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
            throw std::runtime_error("write to the helper failed");
    }

    std::vector<std::string> lines;

private:
    std::optional<std::string> next_line(clk::time_point until)
    {
        for (;;)
        {
            const auto nl = buf_.find('\n');
            if (nl != std::string::npos)
            {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return l;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now());
            if (left.count() <= 0)
                return std::nullopt;
            pollfd p{out_, POLLIN, 0};
            if (poll(&p, 1, static_cast<int>(left.count())) <= 0)
                return std::nullopt;
            char chunk[4096];
            const ssize_t n = read(out_, chunk, sizeof chunk);
            if (n <= 0)
                return std::nullopt;
            buf_.append(chunk, static_cast<std::size_t>(n));
        }
    }

    pid_t pid_ = -1;
    int out_ = -1, in_ = -1;
    std::string buf_;
};

bool starts_with(const std::string &s, const std::string &prefix) { return s.rfind(prefix, 0) == 0; }

// The state once the killed attempt is recorded (the n-th failure: its
// 'processing' was never committed, so only the count tells).
std::string recorded(const std::string &id, int n)
{
    const auto until = clk::now() + 60s;
    while (clk::now() < until)
    {
        pg::result r = query("SELECT state, error_count FROM idem_inbox WHERE consumer = 'procs' AND message_id = $1", id);
        if (!r.empty() && r.get_int(0, 1) >= n)
            return r.get_text(0, 0);
        std::this_thread::sleep_for(20ms);
    }
    return "never recorded";
}

}  // namespace

TEST(KilledProcesses, ConsumerKilledMidHandlerLosesNothingAndRepeatsNothing)
{
    IDEM_REQUIRE_DB();
    const std::string run = idem_test::unique_key("k");
    std::vector<std::string> ids;
    for (int i = 0; i < 40; ++i)
        ids.push_back(run + "-" + std::to_string(100 + i));
    const std::string victim = ids[20];
    std::vector<std::string> args = {"consume", dsn(), "5", victim};
    args.insert(args.end(), ids.begin(), ids.end());
    {
        helper a(args);
        ASSERT_TRUE(a.wait_for([&](const std::string &l) { return l == "handling " + victim; }));
        a.kill();  // inside the handler: its insert is in the open transaction
        for (int i = 0; i < 20; ++i)
            EXPECT_EQ(a.lines[static_cast<std::size_t>(i)], ids[static_cast<std::size_t>(i)] + " processed");
    }
    // The broker redelivers the whole stream to a new consumer.
    args[3] = "-";
    helper b(args);
    ASSERT_EQ(b.finish(), 0);
    ASSERT_EQ(b.lines.size(), ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i)
        EXPECT_EQ(b.lines[i], ids[i] + (i < 20 ? " duplicate" : " processed"));
    pg::result effects = query("SELECT key, count(*) FROM msg_effects WHERE key LIKE $1 || '-%' GROUP BY key", run);
    EXPECT_EQ(effects.size(), ids.size());
    for (std::size_t i = 0; i < effects.size(); ++i)
        EXPECT_EQ(effects.get_int(i, 1), 1) << effects.get_text(i, 0);
    pg::result states = query("SELECT message_id, state, error_count, coalesce(last_error, '') FROM idem_inbox"
                              " WHERE consumer = 'procs' AND message_id LIKE $1 || '-%'",
                              run);
    EXPECT_EQ(states.size(), ids.size());
    for (std::size_t i = 0; i < states.size(); ++i)
    {
        EXPECT_EQ(states.get_text(i, 1), "done");
        const bool is_victim = states.get_text(i, 0) == victim;
        EXPECT_EQ(states.get_int(i, 2), is_victim ? 1 : 0) << states.get_text(i, 0);
        if (is_victim)
        {
            EXPECT_EQ(states.get_text(i, 3), session_ended);
        }
    }
}

TEST(KilledProcesses, CapHoldsWhenConsumersAreKilledAtAPoisonMessage)
{
    IDEM_REQUIRE_DB();
    const std::string poison = idem_test::unique_key("poison");
    for (int n : {1, 2})
    {
        helper c({"consume", dsn(), "2", poison, poison});
        ASSERT_TRUE(c.wait_for([](const std::string &l) { return starts_with(l, "handling"); }));
        c.kill();
        EXPECT_EQ(recorded(poison, n), n == 1 ? "failed" : "dead");
    }
    helper last({"consume", dsn(), "2", poison, poison});
    ASSERT_EQ(last.finish(), 0);
    EXPECT_EQ(last.lines, std::vector<std::string>{poison + " dead"});
    EXPECT_EQ(idem_msg_test::count("FROM msg_effects WHERE key = $1", poison), 0);
    EXPECT_EQ(idem_msg_test::count("FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
                                   " AND payload ->> 'message_id' = $1",
                                   poison),
              1);
}

TEST(KilledProcesses, DrainerKilledMidBatchLosesNothing)
{
    IDEM_REQUIRE_DB();
    query("DELETE FROM idem_outbox");
    pg::result staged = query("SELECT idem_outbox_stage('procs', jsonb_build_object('n', g),"
                              " CASE WHEN g % 3 = 0 THEN 'key-' || (g % 7) END) FROM generate_series(1, 300) g");
    std::set<std::int64_t> ids;
    for (std::size_t i = 0; i < staged.size(); ++i)
        ids.insert(staged.get_int(i, 0));
    std::set<std::int64_t> killed, batch;
    std::string lease_end;
    {
        // It hangs at its 150th publish, halfway through its second batch
        // (the first acked by then); the lease leaves the first batch's 100
        // publishes time on a loaded machine.
        helper r({"relay", dsn(), "100", "5000", "5", "150"});
        ASSERT_TRUE(r.wait_for([&](const std::string &) { return r.lines.size() >= 150; }));
        r.kill();
        for (const std::string &l : r.lines)
            if (starts_with(l, "published "))
                killed.insert(std::stoll(l.substr(10)));
    }
    pg::result leased = query("SELECT id, max(available_at) OVER ()::text FROM idem_outbox_claimed"
                              " WHERE state = 'pending' AND claim_token IS NOT NULL AND $1 <> ''",
                              std::string("x"));
    ASSERT_FALSE(leased.empty());
    for (std::size_t i = 0; i < leased.size(); ++i)
        batch.insert(leased.get_int(i, 0));
    lease_end = leased.get_text(0, 1);
    std::set<std::int64_t> acked;
    std::set_difference(killed.begin(), killed.end(), batch.begin(), batch.end(), std::inserter(acked, acked.end()));
    ASSERT_EQ(acked.size(), 100u);
    ASSERT_TRUE(std::any_of(batch.begin(), batch.end(), [&](auto id) { return killed.count(id); }));
    ASSERT_TRUE(std::any_of(batch.begin(), batch.end(), [&](auto id) { return !killed.count(id); }));

    simple_pool pool(dsn());
    std::vector<outbox_event> published;
    drainer_settings s;
    s.lease = 30s;
    drainer d(pool, [&](const outbox_event &e) {
        published.push_back(e);
        return publish_result::ok();
    }, s);
    const auto until = clk::now() + 60s;
    while (clk::now() < until && published.size() < ids.size() - acked.size())
        if (d.drain_once().claimed == 0)
            std::this_thread::sleep_for(50ms);

    // Everything not acked, once: nothing lost, nothing acked published again.
    std::multiset<std::int64_t> got;
    for (const outbox_event &e : published)
        got.insert(e.id);
    std::multiset<std::int64_t> want;
    std::set_difference(ids.begin(), ids.end(), acked.begin(), acked.end(), std::inserter(want, want.end()));
    EXPECT_EQ(got, want);
    for (const outbox_event &e : published)
    {
        if (!batch.count(e.id))
        {
            EXPECT_EQ(e.attempts, 1) << e.id;
            continue;
        }
        // Came back only after the dead drainer's lease, claimed a second time.
        EXPECT_EQ(e.attempts, 2) << e.id;
        EXPECT_TRUE(query("SELECT $1::timestamptz - interval '30 s' >= $2::timestamptz", e.lease_expires_at, lease_end)
                        .get_bool(0, 0))
            << e.id;
    }
    EXPECT_EQ(query("SELECT count(*) FROM idem_outbox_archive WHERE topic = $1", std::string("procs")).get_int(0, 0), 300);
    EXPECT_EQ(query("SELECT count(*) FROM idem_outbox WHERE state <> 'published' AND $1 <> ''", std::string("x")).get_int(0, 0), 0);
}

TEST(KilledProcesses, StalledDrainersLateAckChangesNothing)
{
    IDEM_REQUIRE_DB();
    query("DELETE FROM idem_outbox");
    pg::result staged = query("SELECT idem_outbox_stage($1, jsonb_build_object('n', g)) FROM generate_series(1, 5) g",
                              std::string("stall"));
    helper s({"stall", dsn(), "1000"});
    ASSERT_TRUE(s.wait_for([](const std::string &l) { return starts_with(l, "publishing"); }));
    EXPECT_EQ(s.lines.back(), "publishing " + std::to_string(staged.get_int(0, 0)));
    std::this_thread::sleep_for(1200ms);  // past its lease: another drainer takes the batch over
    simple_pool pool(dsn());
    drainer other(pool, [](const outbox_event &) { return publish_result::ok(); });
    const batch_report taken = other.drain_once();
    EXPECT_EQ(taken.claimed, 5u);
    EXPECT_EQ(taken.acked, 5u);
    const std::string sql = "SELECT string_agg(id || ' ' || claim_token || ' ' || published_at, ',' ORDER BY id)"
                            " FROM idem_outbox_archive WHERE topic = $1";
    const std::string archived = query(sql, std::string("stall")).get_text(0, 0);
    s.send("go");
    ASSERT_EQ(s.finish(), 0);
    EXPECT_EQ(s.lines.back(), "published=1 acked=0 lease_lost=1 expired=4");
    // The late ack changed nothing: the same archive rows, tokens and times.
    EXPECT_EQ(query(sql, std::string("stall")).get_text(0, 0), archived);
}
