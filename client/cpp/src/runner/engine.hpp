// Internal header of the single-flight runner (not installed): the engine
// behind idem::runner, split by concern over the files of src/runner/:
//   statements.cpp    the SQL it sends and the rows it reads back
//   follow.cpp        claim, follower wait and the claim loop
//   lease_keeper.cpp  the renewal thread
//   settle.cpp        giving a claim up, settling an unknown commit
//   runner.cpp        lease mode (run) and idem::runner itself
//   fenced.cpp        run_fenced
//   in_tx.cpp         run_in_transaction
//   checks.cpp        the first use's check of the extension, store errors reported
//   startup.cpp       runner::check() at start-up: refuse, or wait for the server
//   config.cpp, diagnostics.cpp  the public config and store_error (idem/config.hpp,
//                     idem/diagnostics.hpp)
//
// Follower wake-up. A follower must learn that the winner finished within
// milliseconds, from any connection, through any pooler. pg_idem 0.3.0's
// idem_claim / idem_begin take a fourth argument, max_wait: a follower
// that finds the key in progress blocks inside the server until the
// winner's finalize, release or fail has committed (or its lease ran out),
// and gets the final answer (replay, or the claim) in the same call. The
// first claim of a request carries no max_wait (the server would also
// wait through a cooldown, which the runner answers with 503 +
// Retry-After at once); once it answered in_progress, the next claims
// carry max_wait = what is left of the wait budget: the uncontended path
// is unchanged, a follower makes two calls, the second returning at the
// winner's commit. Which servers have it is found out once per runner
// (its connection provider), from pg_proc. A follower that waits while
// the winner fails waits on through the cooldown (the server's rule) and
// then claims the key.
//
// With follower_wakeup::polling, a follower polls: it naps with jittered
// backoff (poll_min doubling to poll_max, never past the in_progress
// answer's retry_after hint or the budget) and reads the key again with
// idem_lookup, claiming it when it is free.
//
// No session state: the runner takes no advisory lock and sets nothing
// with SET; the claims and the renewal pass lock_wait (pg_idem 0.6.0),
// which the server applies for the call only. Any connection of a
// transaction-mode pooler can serve any statement. (0.2.0 held a session advisory lock on the
// winner's renewal connection instead; a pooler lent that backend to
// others, and followers overshot their budget.)

#pragma once

#include <idem/runner.hpp>

#include <idem/retry.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace idem::detail {

using clock = std::chrono::steady_clock;

// Time left until deadline, never negative.
inline milliseconds remaining(clock::time_point deadline)
{
    auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now());
    return left.count() > 0 ? left : milliseconds(0);
}

// The lock_wait argument: at least a millisecond (the server rounds up to
// whole ones).
inline std::string lock_wait_text(milliseconds d)
{
    return std::to_string(std::max<std::int64_t>(1, d.count())) + "ms";
}

// base scaled by a random factor in [1 - jitter, 1 + jitter], at least 1 ms,
// so that followers do not poll in step.
inline milliseconds jittered(milliseconds base, double jitter)
{
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> dist(1.0 - jitter, 1.0 + jitter);
    auto v = static_cast<std::int64_t>(static_cast<double>(base.count()) * dist(rng));
    return milliseconds(std::max<std::int64_t>(1, v));
}

inline constexpr pg::oid timestamptz_oid = 1184;

// How many times a result whose handler has run is sent to the server
// (each failure settled by reading the key) before it is left to its lease.
inline constexpr unsigned store_attempts = 3;

// A named statement the server session does not have (26000) or already
// has under that name (42P05): what a transaction-mode pooler does to
// named statements. The same statement sent unnamed works.
bool is_prepared_statement_error(const std::exception &e);

// The max_wait of a claim: what is left of the budget, at most one slice.
// Unless configured, a follower behind a pooler, or with a bounded
// connection provider, waits in slices (config::pooled_wait_slice): each
// slice's statement ends, and the pooler gets the server connection back
// for the winner's finalize, the provider the client connection for the
// requests that would run.
inline milliseconds wait_for(const config &cfg, clock::time_point deadline,
                             const pg::connection &conn, bool bounded)
{
    // At least a millisecond, as the Python and Node clients ask: under a
    // millisecond of budget left, 0 would mean "do not wait", answered at
    // once, and the follower would go round again and again until the
    // budget ran out (a spin of calls; the budget's test saw a fourth).
    const milliseconds left = std::max(remaining(deadline), milliseconds(1));
    milliseconds slice = cfg.server_wait_slice();
    if (!cfg.server_wait_slice_set() && (bounded || conn.behind_pooler().value_or(false)))
        slice = config::pooled_wait_slice;
    return slice.count() > 0 ? std::min(left, slice) : left;
}

// A wall-clock instant as timestamptz text, `d` from now.
std::string wall_clock_in(milliseconds d);

// One row of idem_claim / idem_lookup / idem_begin, as selected by the
// statements below.
struct claim_row
{
    std::string outcome;  // as the server sent it (for messages)
    protocol::server_outcome kind = protocol::server_outcome::unknown;
    std::string claim_id;
    std::int64_t generation = 0;
    std::optional<milliseconds> retry_after;
    std::optional<int> status;
    std::optional<std::string> headers_json;
    std::optional<std::string> body;

    // The protocol's action for this outcome is run: the caller owns the claim.
    bool won() const
    {
        return kind != protocol::server_outcome::unknown &&
               protocol::info(kind).what == protocol::action::run;
    }
    // The stored response comes with it (replay, or stored not replayable).
    bool stored() const
    {
        return kind == protocol::server_outcome::replay ||
               kind == protocol::server_outcome::not_replayable;
    }
};

// Reads the one row of a claim statement.
claim_row parse_row(const pg::result &r);

// The claims and the renewal, which pass lock_wait (the longest each wait
// on another transaction's lock on the key may last). claim_wait,
// begin_wait: with idem_claim / idem_begin's max_wait.
struct claim_statements
{
    std::string claim, claim_wait, begin, begin_wait, renew;
};

// The SQL the runner sends, with the extension's schema when configured.
// The claims in two forms with the same parameters: with lock_wait as an
// argument (pg_idem 0.6.0), and legacy, for 0.3.0 - 0.5.x, which sets it
// as lock_timeout around the call (the legacy form goes when
// protocol::oldest_extension reaches 0.6.0).
struct statements
{
    claim_statements plain, legacy;
    std::string lookup, finalize, release, fail;

    explicit statements(const std::string &schema);
};

// What the server's pg_idem offers, found out once per runner.
struct server_features
{
    bool claim_wait = false;  // idem_claim(cache_key, request_hash, lease, max_wait)
    bool begin_wait = false;  // idem_begin(..., max_wait)
    bool lock_wait = false;   // idem_claim(..., max_wait, lock_wait) and the others (0.6.0)
    bool router = false;      // a PL/Proxy router: no extension, its idem_* functions forward
    std::string edition;      // "c" (the library) or "sql" (the SQL edition); empty for a router
};

// a is an older version than b ("0.2.0" < "0.3.0").
bool version_older(std::string_view a, std::string_view b);

// idem.max_response_bytes as shown by current_setting ("2MB", "1024", "-1").
std::optional<std::size_t> parse_size_setting(const std::optional<std::string> &text);


// The waiting duplicates' share of a bounded provider
// (protocol::pool_duplicates_share): a duplicate takes a slot before it
// asks for its next round's connection and gives it back with it.
class duplicate_slots
{
public:
    explicit duplicate_slots(std::size_t size) : free_(size) {}
    bool take(milliseconds within)
    {
        std::unique_lock<std::mutex> lk(mu_);
        if (!cv_.wait_for(lk, within, [&] { return free_ > 0; }))
            return false;
        --free_;
        return true;
    }
    void give()
    {
        std::lock_guard<std::mutex> lk(mu_);
        ++free_;
        cv_.notify_one();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::size_t free_;
};

// A call's slot, if it holds one, and its place among the waiting
// duplicates an exhausted pool's log line counts; both given back when it
// ends.
struct duplicate_mark
{
    duplicate_slots *slot = nullptr;
    std::atomic<int> *waiting = nullptr;
    duplicate_mark() = default;
    duplicate_mark(const duplicate_mark &) = delete;
    duplicate_mark &operator=(const duplicate_mark &) = delete;
    ~duplicate_mark()
    {
        give_slot();
        if (waiting)
            --*waiting;
    }
    void give_slot()
    {
        if (slot)
            slot->give();
        slot = nullptr;
    }
};

// Per request state.
struct call
{
    digest ck{};
    std::string ck_bytes, rh_bytes;
    clock::time_point deadline;
    unsigned iterations = 0;
    milliseconds backoff{0};
    bool wait_reported = false;
    bool can_wait = false;        // the server has max_wait (and wakeup is server_wait)
    bool seen_in_progress = false; // a claim of this request found the key in progress
    bool wait_refused = false;    // a wait in the server was cancelled: poll instead
    bool server_wait = false;     // the last claim carried max_wait
    milliseconds asked{0};        // the max_wait of the last claim
    const char *one_transaction = nullptr;  // the mode, when it needs one transaction on the partition
    clock::time_point sent;       // when it was sent
    duplicate_mark duplicate;     // as a waiting duplicate (bounded providers)
    run_result res;
};

class engine;

// The renewal thread: renews the winner's lease every renew_interval on its
// own connection, and stops as soon as the claim is no longer owned.
class lease_keeper
{
public:
    lease_keeper(const engine &e, call &c, std::string claim_id, connection_handle conn);
    ~lease_keeper() { stop(); }
    void start();
    void stop();
    connection_handle take_connection() { return std::move(conn_); }
    std::shared_ptr<const std::atomic<bool>> lost_flag() const { return lost_; }

private:
    void loop();

    const engine &e_;
    call &c_;
    std::string claim_id_;
    connection_handle conn_;
    std::shared_ptr<std::atomic<bool>> lost_ = std::make_shared<std::atomic<bool>>(false);
    std::mutex mu_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::thread thread_;
};

// How reading the key back settled a commit whose outcome was unknown.
enum class settled
{
    committed,           // our result is stored (replayable)
    committed_uncached,  // our result is stored, not replayable
    not_committed,       // we still own the claim: nothing was stored
    lost,                // the claim is someone else's now
    unknown              // could not find out within the budget
};

class engine
{
public:
    engine(connection_provider &p, config cfg, metrics *m)
        : provider_(p), cfg_(std::move(cfg)), metrics_(m), allow_(cfg_), sql_(cfg_.schema()),
          capacity_(p.capacity())
    {
        if (capacity_)
            slots_.emplace(std::max<std::size_t>(
                1, static_cast<std::size_t>(static_cast<double>(*capacity_) *
                                            protocol::pool_duplicates_share)));
    }

    run_result run(const request_view &req, const handler &h) const;
    run_result run_fenced(const request_view &req, const transaction_handler &h,
                          pg::isolation level) const;
    run_result run_in_tx(const request_view &req, const transaction_handler &h,
                         pg::isolation level) const;

    const config &cfg() const { return cfg_; }
    // Runs one of the runner's statements on a connection or in a
    // transaction, prepared the configured way.
    template <typename Conn, typename... Args>
    pg::result q(Conn &c, const std::string &sql, Args &&...args) const
    {
        return c.exec_prepared(sql, std::vector<pg::param>{pg::to_param(std::forward<Args>(args))...},
                               pg::format::text, cfg_.prepared_statements());
    }
    template <typename Conn>
    pg::result qp(Conn &c, const std::string &sql, const std::vector<pg::param> &params,
                  pg::format f = pg::format::text) const
    {
        return c.exec_prepared(sql, params, f, cfg_.prepared_statements());
    }
    // The same, always unnamed: for the statements after a handler has run
    // that a client-side statement cache must never make fail (the
    // finalize inside the handler's transaction, settling a key).
    template <typename Conn>
    pg::result qu(Conn &c, const std::string &sql, const std::vector<pg::param> &params,
                  pg::format f = pg::format::text) const
    {
        return c.exec_prepared(sql, params, f, pg::preparation::unnamed);
    }
    const statements &sql() const { return sql_; }
    // The claims and the renewal in the form this server takes.
    const claim_statements &calls(pg::connection &conn) const
    {
        return features(conn).lock_wait ? sql_.plain : sql_.legacy;
    }
    // The server's features, asked on conn the first time (then cached);
    // none when asking fails (asked again next time).
    // The first use also checks the extension (checks.cpp): a
    // setup_error when it cannot be used as configured.
    server_features features(pg::connection &conn) const;
    // runner::check(): the same on a connection of its own, asked anew;
    // a server that does not answer yet is waited for up to `wait`
    // (runner_startup.cpp).
    void check(milliseconds wait) const;
    // One try of check().
    void check_once() const;
    // The on_error hook and the log line, once per cause.
    void report(std::exception_ptr error, const char *during) const;
    connection_provider &provider() const { return provider_; }
    void emit(event e) const
    {
        if (!metrics_)
            return;
        try
        {
            metrics_->on_event(e);
        }
        catch (...)
        {
        }
    }

private:
    enum class next
    {
        answer,
        wait,
        claim
    };
    // What a part of a run decided: go on with the next part, go round
    // again (a retry), or the request is answered (or its error rethrown).
    enum class step
    {
        next,
        again,
        answered
    };
    // An in-transaction run across its loop (in_tx.cpp).
    struct in_tx_run
    {
        connection_handle conn;
        bool do_claim = true;
        unsigned attempts = 0;  // transactions the server rolled back
        unsigned broken = 0;    // connections lost in a row
        run_result result;      // once answered
    };
    // What is left to do with a fenced claim once the handler's transaction is over.
    enum class fenced_after
    {
        done,     // stored with the transaction
        give_up,  // release or fail it
        follow,   // lost it (IL001): answer from the key like a follower
        pending   // the handler ran, its result is not stored: leave the key to its lease
    };
    // A fenced win across the tries of the handler's transaction (fenced.cpp).
    struct fenced_run
    {
        fenced_after todo = fenced_after::give_up;
        storage_action action = storage_action::fail;
        outcome result = outcome::failed;
        response resp;
        std::exception_ptr rethrow;  // the handler's error
    };
    using win_fn = std::function<run_result(call &, connection_handle, claim_row &)>;

    // Validation; an answer when the request must not go further.
    std::optional<run_result> prepare(const request_view &req, call &c, bool &unguarded) const;
    run_result finish(call &c, outcome o) const;
    run_result answer(call &c, response r, outcome o) const;
    run_result unavailable(call &c) const;
    // The claim connection of a round: a waiting duplicate's within its
    // budget and, with a bounded provider, its share (pool_exhausted when not).
    connection_handle acquire_round(call &c) const;
    // Said once per runner: a guarded request came without a principal.
    void warn_principal() const;
    // Throws setup_error for fenced or in-transaction mode through a PL/Proxy router.
    void refuse_router(pg::connection &conn, const char *mode) const;
    run_result timed_out(call &c) const;
    void start_waiting(call &c) const;
    // Reports pending_wait for a claim that waited in the server.
    void note_server_wait(call &c, const claim_row &row) const;

    next on_row(call &c, const claim_row &row) const;
    // A follower's turn with the key's row: the answer when the request is
    // answered, or nothing to go round the loop again (claim or read anew).
    std::optional<run_result> follow(call &c, connection_handle &conn, const claim_row &row,
                                     bool &do_claim) const;
    run_result loop(call &c, connection_handle conn, bool claim_first, const win_fn &win) const;
    void wait_for_winner(call &c, pg::connection &conn, const claim_row &row) const;

    claim_row claim(call &c, pg::connection &conn) const;
    claim_row lookup(call &c, pg::connection &conn) const;
    // idem_release / idem_fail by status; marks the result when not owned.
    void give_up_claim(call &c, connection_handle &conn, const std::string &claim_id,
                       storage_action action) const;
    settled settle_by_reading(call &c, const std::string &claim_id,
                              std::int64_t generation) const;
    std::vector<pg::param> finalize_params(const call &c, const std::string &claim_id,
                                           const response &resp, bool strict) const;
    run_result win_standard(call &c, connection_handle conn, claim_row &row,
                            const handler &h) const;
    void store_standard(call &c, connection_handle &conn, const std::string &claim_id,
                        std::int64_t generation, const response &resp) const;
    run_result win_fenced(call &c, connection_handle conn, claim_row &row,
                          const transaction_handler &h, pg::isolation level) const;
    step run_handler_fenced(call &c, claim_context &ctx, const transaction_handler &h,
                            pg::isolation level, unsigned attempt, connection_handle &tx_conn,
                            std::optional<pg::transaction> &tx, fenced_run &run) const;
    step store_fenced(call &c, const claim_row &row, pg::transaction &tx, unsigned attempt,
                      fenced_run &run) const;
    void commit_fenced(call &c, const claim_row &row, pg::transaction &tx, fenced_run &run) const;
    run_result conclude_fenced(call &c, lease_keeper &keeper, claim_row &row, fenced_run &run,
                               const transaction_handler &h, pg::isolation level) const;
    claim_row begin_flight(call &c, in_tx_run &s, pg::isolation level,
                           std::optional<pg::transaction> &tx) const;
    step begin_in_tx(call &c, in_tx_run &s, pg::isolation level, std::optional<pg::transaction> &tx,
                     claim_row &row) const;
    step run_handler_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx,
                           const claim_row &row, const transaction_handler &h, response &resp) const;
    step store_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx, const claim_row &row,
                     response resp) const;
    bool commit_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx, const claim_row &row,
                      const response &resp, storage_action action,
                      std::optional<std::size_t> &server_cap) const;
    run_result unguarded_tx(call &c, const transaction_handler &h, pg::isolation level) const;
    void keep_cooldown(call &c, std::optional<pg::transaction> &tx,
                       const std::string &claim_id) const;

    connection_provider &provider_;
    const config cfg_;
    metrics *metrics_;
    const header_allowlist allow_;
    const statements sql_;
    server_features check_row(const pg::result &r) const;

    mutable std::mutex features_mu_;
    mutable std::optional<server_features> features_;
    mutable std::mutex logged_mu_;
    mutable std::set<std::string> logged_;
    const std::optional<std::size_t> capacity_;  // the provider's bound, if it has one
    mutable std::optional<duplicate_slots> slots_;
    mutable std::atomic<int> duplicates_waiting_{0};
    mutable std::atomic<bool> warned_principal_{false};
};

// Reports which kind of win a claim row is.
void report_win(const engine &e, const claim_row &row);

}  // namespace idem::detail
