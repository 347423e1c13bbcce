// pg_idem C++ client: the message inbox. Process each delivered message
// once, its effects committing with the record that it was processed.
//
//   idem::inbox in(pool);
//   idem::inbox_result r = in.handle("billing", {msg.id(), msg.body()},
//       [&](idem::pg::transaction &tx) {
//           tx.exec("INSERT INTO invoices (order_id) VALUES ($1)", order_id);
//       });
//   switch (r.outcome) {
//   case idem::inbox_outcome::processed:
//   case idem::inbox_outcome::duplicate:
//   case idem::inbox_outcome::dead:        // dead letter staged in the outbox
//   case idem::inbox_outcome::mismatch:    // same id, another payload: log it
//       delivery.ack(); break;
//   case idem::inbox_outcome::retry:       // failure recorded
//       delivery.requeue(r.retry_after); break;
//   case idem::inbox_outcome::unknown:     // connection lost: the redelivery tells
//       delivery.requeue(); break;
//   }
//
// All on one connection from the provider:
//
//   BEGIN; SELECT idem_inbox_begin(consumer, id, sha256(payload), max_attempts);
//     not process -> COMMIT, return the outcome;
//   SAVEPOINT idem_handler; handler(tx); RELEASE SAVEPOINT idem_handler;
//   SELECT idem_inbox_done(consumer, id); COMMIT                  -> processed
//
// The handler throws: ROLLBACK TO SAVEPOINT idem_handler; SELECT ... FROM
// idem_inbox_fail(consumer, id, what()); COMMIT -> retry (with the delay
// before the next attempt), dead (dead letter staged) or duplicate. The
// transaction itself fails (an error at COMMIT, a failing idem_inbox_done,
// a broken savepoint): ROLLBACK, then idem_inbox_fail in autocommit on the
// same connection. If even that cannot be recorded the connection is
// closed: the server records the attempt when the session ends, and the
// message's lock goes with it.
//
// Serialization failures and deadlocks raised by the handler under READ
// COMMITTED are retried in place: ROLLBACK TO the savepoint (the handler's
// writes and locks go, the message stays begun) and run the handler again,
// up to inbox_settings::handler_attempts, without counting a failed attempt.
// Under REPEATABLE READ or SERIALIZABLE (the snapshot is the transaction's,
// so a rerun would see the same conflict), at COMMIT, or after the last
// try, they are recorded as a failure like any other error: the redelivery
// is the retry.
//
// A connection lost while COMMIT is in flight is an unknown outcome: the
// handler is never run again by handle(); the broker's redelivery answers
// duplicate (it committed) or process (it did not; the server counted the
// attempt when the session ended).
#pragma once

#include <idem/error.hpp>
#include <idem/pg.hpp>
#include <idem/protocol.hpp>
#include <idem/provider.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

namespace idem {

// idem::inbox_outcome (processed, duplicate, dead, mismatch, retry, unknown)
// and what to do with each at the broker, protocol::broker_action_of, are
// generated into <idem/protocol.hpp>.
const char *to_string(inbox_outcome o) noexcept;

// One delivery: the broker's message id and the payload as received (its
// SHA-256 is the payload hash that tells a redelivery from a reused id).
struct inbox_message
{
    std::string_view id;
    std::string_view payload;
};

struct inbox_result
{
    inbox_outcome outcome = inbox_outcome::unknown;
    bool handler_ran = false;
    // Times the handler ran (in-place reruns after 40001/40P01 included).
    unsigned handler_runs = 0;
    // After a recorded failure: the failed attempts so far, and how long
    // to wait before the next delivery (zero for dead and duplicate).
    int error_count = 0;
    std::chrono::milliseconds retry_after{0};
    // The handler's or the transaction's error behind retry and unknown.
    std::exception_ptr error;
};

struct inbox_settings
{
    // idem_inbox_begin's cap: the attempt that reaches it makes the message
    // dead (1 .. protocol::inbox_max_attempts).
    int max_attempts = protocol::inbox_default_max_attempts;
    // Runs of the handler per delivery on 40001/40P01 under READ COMMITTED
    // (1 = never rerun; at most 100); also the tries of idem_inbox_begin
    // itself when it gives up with 40001.
    unsigned handler_attempts = 3;
    pg::isolation isolation = pg::isolation::read_committed;
    // Longest error text recorded by idem_inbox_fail (bytes; longer texts
    // are cut on a character boundary).
    std::size_t max_error_bytes = 2000;
    // Schema of the pg_idem functions; empty: the search_path.
    std::string schema;

    // Throws idem::config_error naming the bad setting.
    void validate() const;
};

// The handler writes its effects with tx; it must not commit or roll back.
// Throwing marks the attempt failed.
using inbox_handler = std::function<void(pg::transaction &tx)>;

// Thread safe: share one inbox between consumer threads; each handle()
// takes its own connection from the provider (which must outlive it).
// Connections go back idle, or closed when an attempt could not be
// recorded. Do not put consumers behind transaction-mode pooling: the
// server holds a session-level lock on a message while it is being
// processed.
class inbox
{
public:
    explicit inbox(connection_provider &provider, inbox_settings settings = {});

    // Processes one delivery of message for consumer (see the top of this
    // header). Errors before the message is begun (bad arguments: 22023,
    // 22004; protocol misuse: 55000; a lost connection) propagate as
    // exceptions; once it is begun, handle() reports through the result.
    inbox_result handle(const std::string &consumer, const inbox_message &message,
                        const inbox_handler &handler) const;

    const inbox_settings &settings() const noexcept { return settings_; }

private:
    connection_provider &provider_;
    inbox_settings settings_;
};

}  // namespace idem
