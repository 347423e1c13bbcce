// pg_idem C++ client: the single-flight runner. This is the header to read.
//
//   idem::simple_pool pool("host=/tmp dbname=app");            // or your own provider
//   idem::runner run(pool, idem::config::builder().lease(std::chrono::seconds(10)).build());
//
//   idem::request_view req;
//   req.principal = user_id;  req.method = "POST";  req.target = "/orders?x=1";
//   req.idempotency_keys = header_values("Idempotency-Key");
//   req.body = body;
//   idem::run_result r = run.run(req, [&](const idem::claim_context &claim) {
//       return idem::response{201, {{"Content-Type", "application/json"}}, create_order()};
//   });
//   send(r.response);   // the handler's response, a replay, or a problem+json answer
//
// What run() does with a key (see README for the full matrix):
//   * no key: runs the handler unguarded (or 400 if request_view::key_required);
//     an empty, repeated, over-255-byte, NUL or non-UTF-8 key: 400;
//   * the first request claims the key and runs the handler while a thread
//     renews the lease; no transaction is open while the handler runs.
//     2xx/404/409 are stored and replayed to later requests, 401/403
//     and 3xx are not stored, 5xx/408/429 put the key in a short cooldown;
//     a validation failure, 400/422, is not stored either (the corrected
//     request with the same key runs), or is stored and replayed with
//     config::builder::client_errors(idem::client_errors::store);
//   * concurrent requests with the same key wait (up to the wait budget) and
//     get the stored response with `Idempotent-Replayed: true`, or a
//     retryable answer with Retry-After;
//   * the same key with another body: 422 (IETF profile) / 409 (seed profile).
//
// Exactly-once modes, where the handler's own writes and the stored
// response commit together:
//   * run_fenced: the claim commits first; the handler gets a transaction,
//     in which the runner stores the response with a fenced
//     idem_finalize(strict => true) and commits. If the claim was lost the
//     whole transaction rolls back and the request is answered from the key;
//   * run_in_transaction: claim, handler and finalize in one transaction
//     (idem_begin); duplicates wait inside idem_begin until it commits.
#pragma once

#include <idem/config.hpp>
#include <idem/diagnostics.hpp>
#include <idem/error.hpp>
#include <idem/http.hpp>
#include <idem/key.hpp>
#include <idem/metrics.hpp>
#include <idem/pg.hpp>
#include <idem/provider.hpp>
#include <idem/retry.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace idem {

// What a handler knows about the claim it runs under.
class claim_context
{
public:
    claim_context() = default;
    claim_context(std::int64_t generation, std::string claim_id, digest cache_key,
                  std::shared_ptr<const std::atomic<bool>> lost = nullptr)
        : generation_(generation), claim_id_(std::move(claim_id)), cache_key_(cache_key),
          lost_(std::move(lost))
    {
    }
    // Fencing number: strictly increases with every claim of the key. Tag
    // effects outside PostgreSQL with it and refuse older generations there.
    std::int64_t generation() const noexcept { return generation_; }
    // Empty when the request runs unguarded (no key).
    const std::string &claim_id() const noexcept { return claim_id_; }
    const digest &cache_key() const noexcept { return cache_key_; }
    bool guarded() const noexcept { return !claim_id_.empty(); }
    // True once lease renewal found the claim taken over; a long handler
    // may stop early (its result will not be stored).
    bool lost() const noexcept { return lost_ && lost_->load(); }

private:
    std::int64_t generation_ = 0;
    std::string claim_id_;
    digest cache_key_{};
    std::shared_ptr<const std::atomic<bool>> lost_;
};

struct run_result
{
    // Send this to the client.
    idem::response response;
    idem::outcome outcome = idem::outcome::failed;
    bool handler_ran = false;   // this call ran the handler
    bool replayed = false;      // response is a stored one
    bool lease_stolen = false;  // the claim was lost before the result was stored
    // The handler ran but its result is not stored, or may not be (the
    // finalize refused or lost with its connection, and sending it again
    // on a fresh connection and reading the key back did not store or
    // settle it): the caller gets 503 outcome-unknown with Retry-After.
    // The key is never released for this: it stays pending until its
    // lease runs out, and a retry with the same key is answered from it or
    // recovers it then. `error` holds the database error.
    bool outcome_unknown = false;
    std::int64_t generation = 0;  // of the claim this call won; 0 otherwise
    // The database error behind a 503 answer, for logging.
    std::exception_ptr error;
};

using handler = std::function<response(const claim_context &)>;
using transaction_handler = std::function<response(pg::transaction &, const claim_context &)>;

namespace detail {
class engine;
}

// Thread safe: share one runner between request threads (copies share
// state). Connections come from provider, which must outlive the runner:
// one at a time per request in run() and run_in_transaction(), two in
// run_fenced().
class runner
{
public:
    explicit runner(connection_provider &provider, config cfg = config(),
                    metrics *observer = nullptr);

    // The handler runs with no transaction open. If it throws, the key goes
    // into cooldown and the exception propagates. Once it has returned,
    // storing its result never runs it again nor frees the key for a
    // duplicate: see run_result::outcome_unknown.
    run_result run(const request_view &req, const handler &h) const;

    // Exactly-once, claim first: h's writes and the stored response commit
    // in one transaction on a second connection, fenced by the claim. A
    // serialization failure or deadlock re-runs h in a new transaction (up to
    // config::transaction_attempts); a 5xx/408/429 response rolls h's writes
    // back, one that releases the key (401/403/3xx, and 400/422 unless
    // client_errors::store) commits them. Errors h raises propagate after the key is put in cooldown;
    // an error of the finalize or the COMMIT after h returned (or a
    // connection lost then) is answered 503 outcome-unknown, nothing of h
    // committed and the key left pending to its lease (h is not run again).
    run_result run_fenced(const request_view &req, const transaction_handler &h,
                          pg::isolation level = pg::isolation::read_committed) const;

    // Exactly-once, one transaction: BEGIN; idem_begin; h; idem_finalize;
    // COMMIT, with BEGIN and idem_begin in one flight and idem_finalize and
    // COMMIT in another (libpq's pipeline mode): two round trips besides
    // h's own. Duplicates block in idem_begin (at most the wait budget, as
    // lock_timeout) and then replay. If the finalize or the COMMIT fails
    // after h returned, everything rolls back together but a cooldown,
    // the call answers 503 outcome-unknown (with `error`) and h is not run
    // again in it; only 40001 / 40P01 re-run h, as in run_fenced.
    run_result run_in_transaction(const request_view &req, const transaction_handler &h,
                                  pg::isolation level = pg::isolation::read_committed) const;

    const config &settings() const noexcept;

    // Checks, on a connection of its own, that pg_idem can be used as
    // configured (idem/diagnostics.hpp): the role and the database exist,
    // the extension is installed, not older than idem::oldest_extension,
    // its schema on the search_path (or configured), EXECUTE on its
    // functions, the lease and cooldown within idem.max_lease. A server
    // that does not answer yet (nothing listens, or it is starting up) is
    // tried again for up to `wait`, each failed try given to on_error.
    // Throws idem::setup_error saying what to do. Call it at start-up to
    // refuse to start (protocol.toml [client.startup]); a runner makes the
    // same check at its first request either way (answered 503 meanwhile).
    void check(std::chrono::milliseconds wait = protocol::startup_wait) const;

private:
    std::shared_ptr<const detail::engine> engine_;
};

}  // namespace idem
