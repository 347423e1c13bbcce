// pg_idem C++ client: the outbox drainer. Publishes the events staged with
// idem_outbox_stage (in your transactions) to your broker, at least once,
// in per-key order, from as many drainers as you like.
//
//   idem::drainer d(pool, [&](const idem::outbox_event &e) {
//       if (!broker.send(e.topic, e.key, e.payload.value_or(""), e.headers))
//           return idem::publish_result::failed(broker.last_error());
//       return idem::publish_result::ok();
//   });
//   std::thread t([&] { d.run(); });   // until d.stop()
//   ...
//   d.stop(); t.join();
//
// Each batch, on one connection and with no transaction held while
// publishing:
//
//   SELECT ... FROM idem_outbox_claim(batch, lease)   -- autocommit: at most
//                                                     -- batch events, leased to one token
//   publish each event in id order
//   SELECT idem_outbox_ack(token, published ids)      -- how many were still held
//   SELECT * FROM idem_outbox_nack(token, id, error)  -- per failure: retry | dead | stale
//
// and between empty claims `SELECT idem_outbox_wait(idle_wait)` (autocommit,
// READ COMMITTED), which returns as soon as an event is claimable.
//
// Guarantees and limits:
//   * At least once. An event is published again when its ack is lost:
//     the drainer died or stalled past the lease and another drainer
//     re-claimed it, or the connection failed before the ack. An ack that
//     finds events no longer held is reported (batch_report::lease_lost).
//     Consumers deduplicate by event id (e.g. with idem::inbox).
//   * Per-key order. The server never hands out an event while an earlier
//     event of its key is unpublished. Within a batch, when publishing an
//     event fails, its nack schedules the retry and the batch's later
//     events of the same key are not published (held_back): they come back
//     when their lease runs out, behind the failed one.
//   * The lease. Events are not published once less than lease_margin is
//     left of the batch's lease (counted from when the claim was sent), as
//     another drainer may be publishing them by then (expired); they come
//     back after the lease. Every claim counts an attempt, so an event
//     left this way uses one up.
//   * Stopping. stop() (any thread, any time) interrupts idem_outbox_wait
//     at once (a cancel request), never a publish: with
//     stop_mode::finish_batch (the default) run() publishes and acks the
//     rest of the current batch; with abandon_rest it acks what was
//     published and leaves the rest, which comes back after the lease.
#pragma once

#include <idem/error.hpp>
#include <idem/pg.hpp>
#include <idem/provider.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace idem {

// One claimed event, as idem_outbox_claim returned it.
struct outbox_event
{
    std::int64_t id = 0;
    std::string topic;
    std::optional<std::string> key;
    std::optional<std::string> payload;        // a jsonb payload, as JSON text
    std::optional<std::string> payload_bytes;  // a bytea payload, its bytes
    std::optional<std::string> headers;        // a JSON object of strings, as text
    int attempts = 0;                          // publish attempts, this one included
    std::string created_at;                    // timestamptz as text
    std::string claim_token;                   // uuid as text
    std::string lease_expires_at;              // timestamptz as text
};

// What a publisher answers for one event. Throwing counts as failed(what()).
class publish_result
{
public:
    static publish_result ok() { return publish_result(true, {}); }
    static publish_result failed(std::string error) { return publish_result(false, std::move(error)); }
    bool is_ok() const noexcept { return ok_; }
    const std::string &error() const noexcept { return error_; }

private:
    publish_result(bool ok, std::string error) : ok_(ok), error_(std::move(error)) {}
    bool ok_;
    std::string error_;
};

using publisher = std::function<publish_result(const outbox_event &)>;

enum class stop_mode
{
    finish_batch,  // publish and ack the rest of the current batch
    abandon_rest   // ack what is published; the rest returns after the lease
};

// What one batch did (and, summed, what a drainer did).
struct batch_report
{
    std::size_t claimed = 0;
    std::size_t published = 0;   // the publisher answered ok
    std::size_t acked = 0;       // published and still held by the claim at the ack
    std::size_t lease_lost = 0;  // published, but re-claimed by another drainer before the ack
    std::size_t retried = 0;     // failed; nack answered retry (after idem.outbox_backoff)
    std::size_t dead = 0;        // failed; nack answered dead (no attempts left)
    std::size_t stale = 0;       // failed; nack answered stale (no longer held)
    std::size_t held_back = 0;   // not published: an earlier event of its key failed in this batch
    std::size_t expired = 0;     // not published: less than lease_margin was left
    std::size_t abandoned = 0;   // not published: stop() with stop_mode::abandon_rest

    batch_report &operator+=(const batch_report &o);
};

struct drainer_settings
{
    // Events per claim (1 .. 10000).
    int batch = 100;
    // How long a claim holds its events (10 ms .. 24 h; the server refuses
    // more than idem.max_lease).
    std::chrono::milliseconds lease{30000};
    // Publishing stops this long before the lease ends; nullopt: lease / 5.
    std::optional<std::chrono::milliseconds> lease_margin;
    // Longest idem_outbox_wait between empty claims (1 ms .. 1 h).
    std::chrono::milliseconds idle_wait{5000};
    // Pause of run() after a database error (1 ms .. 1 h).
    std::chrono::milliseconds error_backoff{1000};
    stop_mode on_stop = stop_mode::finish_batch;
    // Longest error text a nack records (bytes, cut on a character boundary).
    std::size_t max_error_bytes = 2000;
    // Schema of the pg_idem functions; empty: the search_path.
    std::string schema;
    // Called after every batch that claimed something (from run()'s or
    // drain_once()'s thread).
    std::function<void(const batch_report &)> on_batch;
    // Called by run() with each database error it recovers from.
    std::function<void(const std::exception_ptr &)> on_error;

    // Throws idem::config_error naming the bad setting.
    void validate() const;
    std::chrono::milliseconds effective_lease_margin() const;
};

// One drainer: run() on one thread at a time, stop() and totals() from
// any. Run several drainers (threads or processes) for throughput; each
// takes its own connection from the provider, which must outlive it.
class drainer
{
public:
    drainer(connection_provider &provider, publisher publish, drainer_settings settings = {});
    drainer(const drainer &) = delete;
    drainer &operator=(const drainer &) = delete;
    ~drainer();

    // Claims one batch and publishes it; claimed == 0 when nothing was
    // claimable. Database errors propagate.
    batch_report drain_once();
    // Drains until stop(): claims while batches come back, waits with
    // idem_outbox_wait when one comes back empty. Recovers from database
    // errors (on_error, then error_backoff, then a new connection if the
    // old one broke). Returns once stopped.
    void run();
    // Asks run() to return (see stop_mode); safe from any thread, also
    // before run() starts. Cannot be undone.
    void stop() noexcept;
    bool stop_requested() const noexcept;
    // The sum of every batch so far.
    batch_report totals() const;

private:
    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace idem
