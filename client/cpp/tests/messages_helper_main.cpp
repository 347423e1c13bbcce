// idem_messages_helper: an inbox consumer or an outbox drainer in its own OS
// process, for the killed-process tests (integration_messages_process_test.cpp).
// Every line it prints is flushed at once: the parent reads them to know
// where to kill it.
//
//   idem_messages_helper consume DSN MAX_ATTEMPTS HANG_ID ID...
//       handles each ID in order for the consumer "procs" (payload "p"),
//       the handler inserting msg_effects(key = ID); at HANG_ID it prints
//       "handling ID" and hangs inside the handler (to be killed). Prints
//       "ID OUTCOME" per message.
//   idem_messages_helper relay DSN BATCH LEASE_MS DELAY_MS HOLD_AT
//       runs a drainer whose publisher prints "published ID" and sleeps
//       DELAY_MS; the HOLD_AT-th publish hangs after its line (to be killed
//       there, mid-batch, however late the parent reads it).
//   idem_messages_helper stall DSN LEASE_MS
//       one drain_once whose publisher prints "publishing ID" for the first
//       event and waits for a line on stdin (a stall past the lease); then
//       prints "published=N acked=N lease_lost=N expired=N".
#include <idem/inbox.hpp>
#include <idem/outbox.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

namespace {

void say(const std::string &line)
{
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

int consume(const std::string &dsn, int max_attempts, const std::string &hang, int argc, char **argv)
{
    idem::simple_pool pool(dsn);
    idem::inbox_settings s;
    s.max_attempts = max_attempts;
    idem::inbox in(pool, s);
    for (int i = 0; i < argc; ++i)
    {
        const std::string id = argv[i];
        idem::inbox_result r = in.handle("procs", {id, "p"}, [&](idem::pg::transaction &tx) {
            tx.exec("INSERT INTO msg_effects (key) VALUES ($1)", id);
            if (id == hang)
            {
                say("handling " + id);
                for (;;)
                    std::this_thread::sleep_for(std::chrono::seconds(1));
            }
        });
        say(id + " " + idem::to_string(r.outcome));
    }
    return 0;
}

int relay(const std::string &dsn, int batch, long lease_ms, long delay_ms, long hold_at)
{
    long publishes = 0;
    idem::simple_pool pool(dsn);
    idem::drainer_settings s;
    s.batch = batch;
    s.lease = std::chrono::milliseconds(lease_ms);
    s.idle_wait = std::chrono::milliseconds(200);
    idem::drainer d(pool, [&](const idem::outbox_event &e) {
        say("published " + std::to_string(e.id));
        if (++publishes == hold_at)
            for (;;)
                std::this_thread::sleep_for(std::chrono::seconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        return idem::publish_result::ok();
    }, s);
    d.run();
    return 0;
}

int stall(const std::string &dsn, long lease_ms)
{
    idem::simple_pool pool(dsn);
    idem::drainer_settings s;
    s.lease = std::chrono::milliseconds(lease_ms);
    s.lease_margin = std::chrono::milliseconds(0);
    bool stalled = false;
    idem::drainer d(pool, [&](const idem::outbox_event &e) {
        if (!stalled)
        {
            stalled = true;
            say("publishing " + std::to_string(e.id));
            std::string line;
            std::getline(std::cin, line);
        }
        return idem::publish_result::ok();
    }, s);
    const idem::batch_report r = d.drain_once();
    say("published=" + std::to_string(r.published) + " acked=" + std::to_string(r.acked) +
        " lease_lost=" + std::to_string(r.lease_lost) + " expired=" + std::to_string(r.expired));
    return 0;
}

}  // namespace

int main(int argc, char **argv)
{
    try
    {
        const std::string mode = argc > 2 ? argv[1] : "";
        if (mode == "consume" && argc >= 5)
            return consume(argv[2], std::atoi(argv[3]), argv[4], argc - 5, argv + 5);
        if (mode == "relay" && argc == 7)
            return relay(argv[2], std::atoi(argv[3]), std::atol(argv[4]), std::atol(argv[5]), std::atol(argv[6]));
        if (mode == "stall" && argc == 4)
            return stall(argv[2], std::atol(argv[3]));
        std::fprintf(stderr, "usage: %s consume|relay|stall DSN ... (see the top of messages_helper_main.cpp)\n",
                     argv[0]);
        return 2;
    }
    catch (const std::exception &e)
    {
        std::fprintf(stderr, "messages helper: %s\n", e.what());
        return 1;
    }
}
