// Internal header of the single-flight runner (not installed): the engine
// behind idem::runner, split by concern over runner*.cpp and
// lease_keeper.cpp:
//   runner_statements.cpp  the SQL it sends and the rows it reads back
//   runner_follow.cpp      claim, follower wait and the claim loop
//   lease_keeper.cpp       the renewal thread
//   runner_settle.cpp      giving a claim up, settling an unknown commit
//   runner.cpp             lease mode (run) and idem::runner itself
//   runner_fenced.cpp      run_fenced
//   runner_in_tx.cpp       run_in_transaction
//
// Follower wake-up. A follower must learn that the winner finished within
// milliseconds, without slowing the uncontended path. NOTIFY inside every
// finalize would take a cluster-wide lock through each commit and serialize
// them, so instead the winner's renewal connection holds a session-level
// advisory lock on (class 'idem', first 4 bytes of the cache key) while the
// handler runs, and lets go of it only once the finalize has committed. The
// winner takes the lock with pg_try_advisory_lock in the same statement as
// its claim (after idem_claim, before the implicit commit), so no follower
// can see the pending row while the lock is still free. A follower that
// sees in_progress blocks on the lock in shared mode (all followers wake
// together) with a lock_timeout of its remaining budget, capped at
// poll_max, then reads the key again with idem_lookup.
//
// Letting go. In lease mode the finalize (or release, fail) runs on the
// lock's own session, in autocommit: that statement takes the lock again at
// transaction level and drops the session-level hold (handing_lock_over),
// so the lock goes at the end of the finalize's transaction, which
// PostgreSQL does after the commit is visible. No unlock statement after
// the commit, no third round trip. A libpq pipeline (finalize, Sync,
// unlock, Sync) would save the round trip as well but needs pipeline mode
// in the libpq wrapper and, unlike the hand-over, would run the unlock even
// after a failed finalize (the Sync ends the failed transaction and the
// unlock runs), waking followers before the release; a multi-statement
// simple query would run the unlock inside the finalize's implicit
// transaction, before its commit; handing the unlock to the renewal thread
// only moves the round trip, as the connection must stay out of the pool
// until the unlock is done (the request waits, or a thread outlives it).
// A separate unlock statement (unlock_sql) remains the fallback: the
// hand-over did not happen (an error, the lock not held), and fenced mode,
// whose finalize commits on another connection.
//
// Costs on the uncontended path: no statement of its own (the lock rides
// on the claim and the finalize), only the extra lock calls those two
// statements parse, plan and run, on a connection no one else waits for;
// advisory locks live in the lock manager and serialize nothing.
// A winner that dies ends its session, which drops the lock: followers wake
// at once and fall back to polling (backoff poll_min..poll_max with jitter,
// never beyond the lease's remaining time) until the lease expires and one
// of them recovers the key. Polling is also the fallback when the lock is
// missing or held by another key's winner (32-bit collision), and the only
// mechanism with follower_wakeup::polling (transaction-mode poolers).
// The two-int4 advisory lock space (objsubid 2) never collides with the
// single-bigint one applications usually use.
#include <idem/runner.hpp>
#pragma once

#include <idem/runner.hpp>

#include <idem/retry.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace idem::detail {

using clock = std::chrono::steady_clock;

inline constexpr std::int32_t lock_class = 0x6964656d;  // 'idem'

// Time left until deadline, never negative.
inline milliseconds remaining(clock::time_point deadline)
{
    auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now());
    return left.count() > 0 ? left : milliseconds(0);
}

// lock_timeout value; 0 would mean "wait forever".
inline std::string lock_timeout_text(milliseconds d)
{
    return std::to_string(std::max<std::int64_t>(1, d.count())) + "ms";
}

// The advisory lock key of a cache key: its first four bytes.
inline std::int32_t lock_key_of(const digest &d)
{
    std::uint32_t v = (std::uint32_t(d[0]) << 24) | (std::uint32_t(d[1]) << 16) |
                      (std::uint32_t(d[2]) << 8) | std::uint32_t(d[3]);
    return static_cast<std::int32_t>(v);
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

// One row of idem_claim / idem_lookup / idem_begin, as selected by the
// statements below.
struct claim_row
{
    std::string outcome;
    std::string claim_id;
    std::int64_t generation = 0;
    std::optional<milliseconds> retry_after;
    std::optional<int> status;
    std::optional<std::string> headers_json;
    std::optional<std::string> body;
    // For a won claim: the winner's advisory lock was taken. For in_progress:
    // no one holds it (the winner is gone, or has just finished).
    std::optional<bool> lock_flag;

    bool won() const
    {
        return outcome == "claimed" || outcome == "recovered_ttl" ||
               outcome == "recovered_abandoned";
    }
};

// Reads the one row of a claim statement.
claim_row parse_row(const pg::result &r);

// The SQL the runner sends, with the extension's schema when configured.
struct statements
{
    std::string claim, lookup, begin, renew, probe_renew, finalize, release, fail;
    // The same on the session that holds the wake-up lock, releasing it at
    // their commit (handing_lock_over).
    std::string finalize_unlock, release_unlock, fail_unlock;

    explicit statements(const std::string &schema);
};

inline constexpr const char *wait_sql =
    "SELECT 1 FROM (SELECT pg_catalog.set_config('lock_timeout', $1, true) AS lt) s "
    "CROSS JOIN LATERAL pg_catalog.pg_advisory_xact_lock_shared("
    "CASE WHEN s.lt IS NOT NULL THEN $2::int4 END, $3::int4) l";
inline constexpr const char *try_lock_sql = "SELECT pg_catalog.pg_try_advisory_lock($1, $2)";
inline constexpr const char *unlock_sql = "SELECT pg_catalog.pg_advisory_unlock($1, $2)";
inline constexpr const char *get_lock_timeout_sql =
    "SELECT pg_catalog.current_setting('lock_timeout'), "
    "pg_catalog.set_config('lock_timeout', $1, true)";
inline constexpr const char *set_lock_timeout_sql = "SELECT pg_catalog.set_config('lock_timeout', $1, true)";

// idem.max_response_bytes as shown by current_setting ("2MB", "1024", "-1").
std::optional<std::size_t> parse_size_setting(const std::optional<std::string> &text);


// Per request state.
struct call
{
    digest ck{};
    std::string ck_bytes, rh_bytes;
    std::int32_t lock_key = 0;
    clock::time_point deadline;
    unsigned iterations = 0;
    milliseconds backoff{0};
    bool wait_reported = false;
    bool rechecked = false;  // saw "no lock holder" and read once more already
    run_result res;
};

class engine;

// The renewal thread: renews the winner's lease every renew_interval on its
// own connection, takes the wake-up lock if the claim statement could not,
// and stops (dropping the lock) as soon as the claim is no longer owned.
class lease_keeper
{
public:
    lease_keeper(const engine &e, call &c, std::string claim_id, connection_handle conn,
                 bool lock_held);
    ~lease_keeper() { stop(); }
    void start();
    void stop();
    connection_handle take_connection() { return std::move(conn_); }
    bool lock_held() const { return lock_held_; }
    std::shared_ptr<const std::atomic<bool>> lost_flag() const { return lost_; }

private:
    void loop();

    const engine &e_;
    call &c_;
    std::string claim_id_;
    connection_handle conn_;
    bool lock_held_;
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
        : provider_(p), cfg_(std::move(cfg)), metrics_(m), allow_(cfg_), sql_(cfg_.schema())
    {
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
    const statements &sql() const { return sql_; }
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
    using win_fn = std::function<run_result(call &, connection_handle, claim_row &)>;

    // Validation; an answer when the request must not go further.
    std::optional<run_result> prepare(const request_view &req, call &c, bool &unguarded) const;
    run_result finish(call &c, outcome o) const;
    run_result answer(call &c, response r, outcome o) const;
    run_result unavailable(call &c) const;
    run_result timed_out(call &c) const;
    void start_waiting(call &c) const;

    next on_row(call &c, const claim_row &row) const;
    // A follower's turn with the key's row: the answer when the request is
    // answered, or nothing to go round the loop again (claim or read anew).
    std::optional<run_result> follow(call &c, connection_handle &conn, const claim_row &row,
                                     bool &do_claim) const;
    run_result loop(call &c, connection_handle conn, bool claim_first, const win_fn &win) const;
    void wait_for_winner(call &c, pg::connection &conn, const claim_row &row) const;

    claim_row claim(call &c, pg::connection &conn) const;
    claim_row lookup(call &c, pg::connection &conn) const;
    // Drops the wake-up lock `held` on conn with a statement of its own.
    void unlock(call &c, connection_handle &conn, bool held) const;
    // idem_release / idem_fail by status; false when not owned. With `held`
    // (conn holds the wake-up lock), the statement also releases the lock at
    // its commit and clears *held when it did.
    void give_up_claim(call &c, connection_handle &conn, const std::string &claim_id,
                       storage_action action, bool *held = nullptr) const;
    settled settle_by_reading(call &c, const std::string &claim_id,
                              std::int64_t generation) const;
    std::vector<pg::param> finalize_params(const call &c, const std::string &claim_id,
                                           const response &resp, bool strict) const;
    run_result win_standard(call &c, connection_handle conn, claim_row &row,
                            const handler &h) const;
    void store_standard(call &c, connection_handle &conn, bool &held, const std::string &claim_id,
                        std::int64_t generation, const response &resp) const;
    run_result win_fenced(call &c, connection_handle conn, claim_row &row,
                          const transaction_handler &h, pg::isolation level) const;
    run_result unguarded_tx(call &c, const transaction_handler &h, pg::isolation level) const;

    connection_provider &provider_;
    const config cfg_;
    metrics *metrics_;
    const header_allowlist allow_;
    const statements sql_;
};

// Reports which kind of win a claim row is.
void report_win(const engine &e, const claim_row &row);

}  // namespace idem::detail
