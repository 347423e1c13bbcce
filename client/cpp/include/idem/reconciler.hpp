// pg_idem C++ client: multi-step attempts (a blob in an object store, then
// a promotion in the database) from the service's side, and the
// reconciler that finishes or reaps the attempts their clients abandoned.
//
// The service, for an upload with a declared digest:
//
//   idem::attempt_request req{"doc", "acct-7/reports", request_id, user,
//                             R"({"title": "Q3"})", "q3.pdf", idem::sha256(body)};
//   idem::attempt_decision d = idem::open_attempt(conn, req);     // autocommit
//   if (d.decision == "new" || d.decision == "reopened" ||
//       (d.decision == "resume" && d.next_step == "upload"))
//       store.put_if_absent(*d.object_key, body);                 // never overwrites
//   idem::complete_attempt(conn, store, d.attempt(req), [&](idem::pg::transaction &tx,
//                                                            const idem::attempt_ref &a) {
//       tx.exec("INSERT INTO documents (attempt_id, key) VALUES ($1::uuid, $2)",
//               a.attempt_id, a.object_key);                      // the entity (append kinds)
//       return idem::promotion_event{};                           // default topic and payload
//   });
//
// complete_attempt reads the blob's digest back from the store and, when it
// is the declared one, stores and promotes in one transaction with the
// finalizer's writes and the outbox event. Never on bare existence.
//
// The reconciler, every interval (several may run at once: the server
// hands them disjoint batches with SKIP LOCKED):
//
//   1. BEGIN; SELECT * FROM idem_attempt_reconcile_batch(grace, batch);
//      per attempt, in a savepoint:
//        pending, no declared digest or no blob  -> idem_attempt_fail(reaped_no_blob)
//        pending, blob digest = declared         -> idem_attempt_store, finalizer,
//                                                   idem_attempt_promote
//        pending, blob digest != declared        -> idem_attempt_fail(digest_mismatch)
//        stored,  blob digest = declared         -> finalizer, idem_attempt_promote
//        stored,  blob missing or changed        -> logged and left
//      COMMIT (a false answer means another party moved the attempt on: skipped)
//   2. sweep: idem_attempt_sweep_batch(grace, batch) lists the keys of
//      abandoned generations; each blob is removed, then idem_attempt_swept
//   3. prune: idem_attempt_prune(retention, batch) until a batch comes back short
#pragma once

#include <idem/blob_store.hpp>
#include <idem/error.hpp>
#include <idem/key.hpp>
#include <idem/pg.hpp>
#include <idem/provider.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

// ---- the service's side ---------------------------------------------------

// What the service knows of an attempt: the columns of
// idem_attempt_reconcile_batch (mode is empty when the caller did not say).
struct attempt_ref
{
    std::string attempt_id;  // uuid as text
    std::int64_t generation = 0;
    std::string status;      // pending or stored
    std::string kind;
    std::string mode;        // append or replace
    std::string target;
    std::string object_key;
    std::optional<digest> declared_digest;
};

// The arguments of idem_attempt_open.
struct attempt_request
{
    std::string kind;
    std::string target;
    std::string client_request_id;
    std::string created_by;
    std::string intent_json;  // a JSON object
    std::string object_name = "object";
    std::optional<digest> declared_digest;
};

// What idem_attempt_open answered (see the decision table in the README).
struct attempt_decision
{
    // new, resume, promoted, superseded, mismatch, reopened, gone or forbidden.
    std::string decision;
    std::optional<std::string> attempt_id;
    std::int64_t generation = 0;
    std::optional<std::string> status;
    std::optional<std::string> failure_reason;
    std::optional<std::string> next_step;  // upload or promote
    std::optional<std::string> object_key;
    std::optional<digest> declared_digest;
    std::optional<std::string> current_attempt_id;
    std::optional<std::string> created_at;

    // The attempt as complete_attempt takes it; std::logic_error when the
    // decision names no live attempt.
    attempt_ref attempt(const attempt_request &req) const;
};

// idem_attempt_open on c (in the caller's transaction, if one is open).
attempt_decision open_attempt(pg::connection &c, const attempt_request &req,
                              const std::string &schema = {});

// idem_attempt_safe_name and idem_attempt_object_key, computed locally
// (UTF-8 names): {key_prefix}/{target}/{attempt_id}/g{generation}/{safe name}.
// std::invalid_argument where the server raises 22023.
std::string safe_object_name(std::string_view name);
std::string object_key(std::string_view key_prefix, std::string_view target,
                       std::string_view attempt_id, std::int64_t generation,
                       std::string_view object_name);

// The outbox event of a promotion: nullopt topic is '<kind>.promoted',
// nullopt payload is the server's (a JSON object merged under its fields).
struct promotion_event
{
    std::optional<std::string> topic;
    std::optional<std::string> payload_json;
};

// Runs in the promotion's transaction, before idem_attempt_promote: an
// append kind inserts its entity here. Throwing rolls the promotion back.
using finalizer = std::function<promotion_event(pg::transaction &, const attempt_ref &)>;

enum class completion
{
    promoted,         // stored (if it was pending) and promoted, with the finalizer's writes
    stale,            // the attempt moved on (another party finished or failed it)
    missing_blob,     // no blob at the key: nothing written (upload, or let the reconciler reap)
    digest_mismatch   // the blob is not the declared one: the attempt failed (pending) or was left (stored)
};

const char *to_string(completion c) noexcept;

// Verifies the blob's digest in store and promotes: BEGIN;
// idem_attempt_store (pending only); finalizer; idem_attempt_promote;
// COMMIT. A wrong blob of a pending attempt fails it (digest_mismatch,
// its next open reopens it under a new key). expected is the digest the
// caller computed for an attempt opened without one (an export); the
// declared digest wins otherwise. Retries 40001/40P01 up to attempts times.
completion complete_attempt(pg::connection &c, blob_store &store, const attempt_ref &attempt,
                            const finalizer &finalize = {},
                            std::optional<digest> expected = std::nullopt,
                            const std::string &schema = {}, unsigned attempts = 3);

// ---- the reconciler ---------------------------------------------------------

struct reconciler_settings
{
    // Attempts idle for less than grace are left to their clients (>= 0).
    std::chrono::milliseconds grace = std::chrono::hours(1);
    // Attempts per transaction, for each of the three passes (1 .. 1000000).
    int batch = 100;
    // Time between two runs of run() (1 ms .. 1 day).
    std::chrono::milliseconds interval = std::chrono::minutes(5);
    // Finished attempts are deleted after this (>= 0).
    std::chrono::milliseconds retention = std::chrono::hours(24 * 31);
    // Upper bound on the transactions of one pass (a backlog is finished
    // by later runs).
    int max_batches_per_pass = 100;
    // Schema of the pg_idem functions; empty: the search_path.
    std::string schema;
    // Receives a line for everything left alone or gone wrong.
    std::function<void(const std::string &)> log;

    // Throws idem::config_error naming the bad setting.
    void validate() const;
};

// What a run did.
struct reconcile_report
{
    std::size_t examined = 0;          // attempts handed to this reconciler
    std::size_t promoted = 0;          // pending or stored, blob verified, promoted
    std::size_t reaped_no_blob = 0;    // pending without a declared digest or a blob: failed
    std::size_t digest_mismatch = 0;   // pending with a wrong blob: failed
    std::size_t left = 0;              // stored with a missing or changed blob, or no finalizer
    std::size_t stale = 0;             // moved on meanwhile (a call answered false)
    std::size_t errors = 0;            // an attempt's savepoint rolled back on an error
    std::size_t swept_keys = 0;        // abandoned-generation keys deleted (or already gone)
    std::size_t swept_attempts = 0;    // idem_attempt_swept calls that recorded progress
    std::size_t pruned = 0;            // finished attempts deleted

    reconcile_report &operator+=(const reconcile_report &o);
};

// Thread safe between run()/run_once() on one thread and stop() from any;
// separate reconcilers (threads, processes) may run at once.
class reconciler
{
public:
    reconciler(connection_provider &provider, blob_store &store, reconciler_settings settings = {});
    reconciler(const reconciler &) = delete;
    reconciler &operator=(const reconciler &) = delete;
    ~reconciler();

    // The finalizer of a kind's promotions (required for append kinds:
    // without one their attempts are stored but left unpromoted). Set them
    // before running.
    void set_finalizer(const std::string &kind, finalizer f);

    // The three passes; database errors propagate (the pass's current
    // transaction rolls back; what committed stays).
    reconcile_report reconcile_pass();
    reconcile_report sweep_pass();
    reconcile_report prune_pass();
    // All three, in that order.
    reconcile_report run_once();
    // run_once every interval until stop(); errors are logged, not thrown.
    void run();
    void stop() noexcept;

private:
    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace idem
