// The single-flight runner: claim, lease renewal, follower wait, status
// matrix, replay, and the two exactly-once modes.
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

#include <idem/retry.hpp>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace idem {

namespace {

using clock = std::chrono::steady_clock;
using std::chrono::duration_cast;

constexpr std::int32_t lock_class = 0x6964656d;  // 'idem'

milliseconds remaining(clock::time_point deadline)
{
    auto left = duration_cast<milliseconds>(deadline - clock::now());
    return left.count() > 0 ? left : milliseconds(0);
}

// lock_timeout value; 0 would mean "wait forever".
std::string lock_timeout_text(milliseconds d)
{
    return std::to_string(std::max<std::int64_t>(1, d.count())) + "ms";
}

std::int32_t lock_key_of(const digest &d)
{
    std::uint32_t v = (std::uint32_t(d[0]) << 24) | (std::uint32_t(d[1]) << 16) |
                      (std::uint32_t(d[2]) << 8) | std::uint32_t(d[3]);
    return static_cast<std::int32_t>(v);
}

milliseconds jittered(milliseconds base, double jitter)
{
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> dist(1.0 - jitter, 1.0 + jitter);
    auto v = static_cast<std::int64_t>(static_cast<double>(base.count()) * dist(rng));
    return milliseconds(std::max<std::int64_t>(1, v));
}

std::string quote_ident(const std::string &s)
{
    std::string out = "\"";
    for (char c : s)
    {
        if (c == '"')
            out += '"';
        out += c;
    }
    return out + "\"";
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

claim_row parse_row(const pg::result &r)
{
    if (r.size() != 1)
        throw pg::failure("pg_idem: expected one row from the claim function, got " +
                          std::to_string(r.size()));
    claim_row row;
    row.outcome = r.get_optional_text(0, 0).value_or("");
    row.claim_id = r.get_optional_text(0, 1).value_or("");
    row.generation = r.get_optional_int(0, 2).value_or(0);
    if (auto ms = r.get_optional_int(0, 3))
        row.retry_after = milliseconds(*ms);
    if (auto st = r.get_optional_int(0, 4))
        row.status = static_cast<int>(*st);
    row.headers_json = r.get_optional_text(0, 5);
    if (!r.is_null(0, 6))
        row.body = r.get_bytea(0, 6);
    if (!r.is_null(0, 7))
        row.lock_flag = r.get_bool(0, 7);
    return row;
}

// One more column for a statement run on the session that holds the
// wake-up lock (class $n, key $n + 1): it hands the lock over to the
// statement's own transaction. It takes the same lock at transaction level
// (granted at once to the session that holds it, waiters or not; CASE
// makes this happen first) and only then drops the session-level hold, so
// the lock is never free in between. The transaction-level hold lasts until
// the transaction ends, and PostgreSQL releases a transaction's locks after
// its commit is visible to other sessions (CommitTransaction:
// ProcArrayEndTransaction, then ResourceOwnerRelease of the locks): a
// follower blocked on the lock wakes up to the committed row, without a
// statement after the commit. True when the session-level hold was dropped.
// Placed last in the target list, which PostgreSQL evaluates left to right:
// an error raised by idem_finalize / idem_release / idem_fail comes before
// the hand-over, and the session still holds the lock for the fallback.
// (A subquery behind OFFSET 0 would order it too, but its second query
// level to parse and plan made every finalize measurably slower.)
std::string handing_lock_over(int n)
{
    const std::string cls = "$" + std::to_string(n), key = "$" + std::to_string(n + 1);
    return ", CASE WHEN pg_catalog.pg_try_advisory_xact_lock(" + cls + ", " + key +
           ") THEN pg_catalog.pg_advisory_unlock(" + cls + ", " + key + ") END";
}

// The SQL the runner sends, with the extension's schema when configured.
struct statements
{
    std::string claim, lookup, begin, renew, probe_renew, finalize, release, fail;
    // The same on the session that holds the wake-up lock, releasing it at
    // their commit (handing_lock_over).
    std::string finalize_unlock, release_unlock, fail_unlock;

    explicit statements(const std::string &schema)
    {
        const std::string p = schema.empty() ? "" : quote_ident(schema) + ".";
        const std::string cols =
            "SELECT r.outcome, r.claim_id::text, r.generation, "
            "ceil(extract(epoch FROM r.retry_after) * 1000)::int8, "
            "r.response_status, r.response_headers::text, r.response_body, ";
        // lock_timeout is set before idem_claim runs (the LATERAL reference
        // orders them) so a claim stuck behind an idem_begin transaction
        // gives up with the wait budget.
        claim = cols +
                "CASE WHEN $4 AND r.outcome IN ('claimed', 'recovered_ttl', 'recovered_abandoned') "
                "THEN pg_catalog.pg_try_advisory_lock($5, $6) "
                "WHEN $4 AND r.outcome = 'in_progress' "
                "THEN pg_catalog.pg_try_advisory_xact_lock_shared($5, $6) END "
                "FROM (SELECT pg_catalog.set_config('lock_timeout', $7, true) AS lt) s "
                "CROSS JOIN LATERAL " +
                p + "idem_claim($1, $2, CASE WHEN s.lt IS NOT NULL THEN $3::interval END) r";
        lookup = cols +
                 "CASE WHEN $3 AND r.outcome = 'in_progress' "
                 "THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END "
                 "FROM " +
                 p + "idem_lookup($1, $2) r";
        begin = cols +
                "CASE WHEN $3 AND r.outcome = 'in_progress' "
                "THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END "
                "FROM " +
                p + "idem_begin($1, $2) r";
        renew = "SELECT CASE WHEN s.lt IS NOT NULL THEN " + p +
                "idem_renew($1, $2::uuid, $3::interval) IS NOT NULL END "
                "FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s";
        probe_renew = renew;
        // $7: the body is over the client's cap. The server stores a body
        // over idem.max_response_bytes as completed, not replayable, so the
        // runner lowers that setting to 0 for this transaction and sends one
        // byte instead of the whole body. The setting is read after the
        // finalize (which loads the library on a fresh connection).
        const std::string finalize_cols =
            "SELECT " + p +
            "idem_finalize($1, $2::uuid, $3::int4, $4::jsonb, $5, $6), "
            "pg_catalog.current_setting('idem.max_response_bytes', true)";
        const std::string finalize_from =
            " FROM (SELECT CASE WHEN $7 THEN pg_catalog.set_config("
            "'idem.max_response_bytes', '0', true) END AS forced) s";
        finalize = finalize_cols + finalize_from;
        release = "SELECT " + p + "idem_release($1, $2::uuid)";
        fail = "SELECT " + p + "idem_fail($1, $2::uuid, $3::interval)";
        finalize_unlock = finalize_cols + handing_lock_over(8) + finalize_from;
        release_unlock = release + handing_lock_over(3);
        fail_unlock = fail + handing_lock_over(4);
    }
};

constexpr const char *wait_sql =
    "SELECT 1 FROM (SELECT pg_catalog.set_config('lock_timeout', $1, true) AS lt) s "
    "CROSS JOIN LATERAL pg_catalog.pg_advisory_xact_lock_shared("
    "CASE WHEN s.lt IS NOT NULL THEN $2::int4 END, $3::int4) l";
constexpr const char *try_lock_sql = "SELECT pg_catalog.pg_try_advisory_lock($1, $2)";
constexpr const char *unlock_sql = "SELECT pg_catalog.pg_advisory_unlock($1, $2)";
constexpr const char *get_lock_timeout_sql =
    "SELECT pg_catalog.current_setting('lock_timeout'), "
    "pg_catalog.set_config('lock_timeout', $1, true)";
constexpr const char *set_lock_timeout_sql = "SELECT pg_catalog.set_config('lock_timeout', $1, true)";

// idem.max_response_bytes as shown by current_setting ("2MB", "1024", "-1").
std::optional<std::size_t> parse_size_setting(const std::optional<std::string> &text)
{
    if (!text || text->empty())
        return std::nullopt;
    std::size_t i = 0;
    long long n = 0;
    bool neg = false;
    if ((*text)[0] == '-')
        neg = true, i = 1;
    for (; i < text->size() && std::isdigit(static_cast<unsigned char>((*text)[i])); ++i)
        n = n * 10 + ((*text)[i] - '0');
    if (neg)
        return std::nullopt;
    std::string unit = text->substr(i);
    long long mult = 1;
    if (unit == "kB")
        mult = 1024;
    else if (unit == "MB")
        mult = 1024LL * 1024;
    else if (unit == "GB")
        mult = 1024LL * 1024 * 1024;
    else if (unit == "TB")
        mult = 1024LL * 1024 * 1024 * 1024;
    else if (!unit.empty() && unit != "B")
        return std::nullopt;
    return static_cast<std::size_t>(n * mult);
}

}  // namespace

namespace detail {

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

// ---- lease keeper ----------------------------------------------------------

lease_keeper::lease_keeper(const engine &e, call &c, std::string claim_id, connection_handle conn,
                           bool lock_held)
    : e_(e), c_(c), claim_id_(std::move(claim_id)), conn_(std::move(conn)), lock_held_(lock_held)
{
}

void lease_keeper::start()
{
    thread_ = std::thread([this] { loop(); });
}

void lease_keeper::stop()
{
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable())
        thread_.join();
}

void lease_keeper::loop()
{
    const config &cfg = e_.cfg();
    const bool want_lock = cfg.wakeup() == follower_wakeup::advisory_lock;
    const auto never = clock::time_point::max();
    auto next_renew = clock::now() + cfg.renew_interval();
    milliseconds lock_retry(1);
    auto next_lock = (want_lock && !lock_held_) ? clock::now() : never;

    for (;;)
    {
        {
            std::unique_lock<std::mutex> lk(mu_);
            if (cv_.wait_until(lk, std::min(next_renew, next_lock), [this] { return stopping_; }))
                return;
        }
        const auto now = clock::now();
        try
        {
            if (!conn_)
            {
                conn_ = e_.provider().acquire();
                lock_held_ = false;
                if (want_lock)
                    next_lock = now;
            }
            if (now >= next_lock)
            {
                lock_held_ = conn_->exec(try_lock_sql, lock_class, c_.lock_key).get_bool(0, 0);
                if (lock_held_)
                    next_lock = never;
                else
                {
                    next_lock = now + lock_retry;
                    lock_retry = std::min(lock_retry * 2, cfg.poll_max());
                }
            }
            if (now >= next_renew)
            {
                pg::result r = conn_->exec(e_.sql().renew, pg::as_bytea(c_.ck_bytes), claim_id_,
                                           cfg.lease(), lock_timeout_text(cfg.renew_interval()));
                if (r.is_null(0, 0) || !r.get_bool(0, 0))
                {
                    // Taken over: stop renewing and let followers look.
                    lost_->store(true);
                    if (lock_held_)
                    {
                        try
                        {
                            conn_->exec(unlock_sql, lock_class, c_.lock_key);
                        }
                        catch (...)
                        {
                            conn_->close();
                        }
                        lock_held_ = false;
                    }
                    return;
                }
                next_renew = now + cfg.renew_interval();
            }
        }
        catch (const std::exception &)
        {
            // A lost connection (the lock went with its session), lock_timeout,
            // or the database unreachable: try again sooner than usual, but
            // never in a tight loop.
            if (!conn_ || !conn_->is_open())
            {
                conn_.reset();
                lock_held_ = false;
            }
            const auto retry = now + std::max(milliseconds(1), cfg.renew_interval() / 4);
            next_renew = std::max(next_renew, retry);
            if (want_lock && !lock_held_)
                next_lock = std::max(next_lock == never ? retry : next_lock, retry);
        }
    }
}

// ---- engine: shared pieces --------------------------------------------------

run_result engine::finish(call &c, outcome o) const
{
    c.res.outcome = o;
    if (metrics_)
    {
        try
        {
            metrics_->on_outcome(o);
        }
        catch (...)
        {
        }
    }
    return std::move(c.res);
}

run_result engine::answer(call &c, response r, outcome o) const
{
    c.res.response = std::move(r);
    return finish(c, o);
}

run_result engine::unavailable(call &c) const
{
    if (!c.res.error)
        c.res.error = std::current_exception();
    return answer(c, problems::store_unavailable(cfg_.profile(), cfg_.retry_after()),
                  outcome::failed);
}

run_result engine::timed_out(call &c) const
{
    return answer(c, problems::in_progress(cfg_.profile(), cfg_.retry_after()), outcome::timeout);
}

void engine::start_waiting(call &c) const
{
    if (!c.wait_reported)
    {
        c.wait_reported = true;
        emit(event::pending_wait);
    }
}

std::optional<run_result> engine::prepare(const request_view &req, call &c, bool &unguarded) const
{
    unguarded = false;
    const key_status ks = check_key_header(req.idempotency_keys);
    if (ks == key_status::absent && req.key_required)
        return answer(c, problems::missing_key(cfg_.profile()), outcome::rejected);
    if (ks != key_status::absent && ks != key_status::ok)
        return answer(c, problems::invalid_key(cfg_.profile(), ks), outcome::rejected);
    if (req.body.size() > cfg_.max_request_body_bytes())
        return answer(c, problems::request_too_large(cfg_.profile(), cfg_.max_request_body_bytes()),
                      outcome::rejected);
    if (ks == key_status::absent)
    {
        unguarded = true;
        return std::nullopt;
    }
    c.ck = cache_key(req.principal, req.method, req.target, req.idempotency_keys.front());
    c.ck_bytes = to_bytes(c.ck);
    c.rh_bytes = to_bytes(request_hash(req.body));
    c.lock_key = lock_key_of(c.ck);
    c.deadline = clock::now() + cfg_.follower_wait_budget();
    c.backoff = cfg_.poll_min();
    return std::nullopt;
}

claim_row engine::claim(call &c, pg::connection &conn) const
{
    const bool use_lock = cfg_.wakeup() == follower_wakeup::advisory_lock;
    std::vector<pg::param> params{
        pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(pg::as_bytea(c.rh_bytes)),
        pg::to_param(cfg_.lease()),           pg::to_param(use_lock),
        pg::to_param(lock_class),             pg::to_param(c.lock_key),
        pg::to_param(lock_timeout_text(remaining(c.deadline)))};
    return parse_row(conn.exec_params(sql_.claim, params, pg::format::binary));
}

claim_row engine::lookup(call &c, pg::connection &conn) const
{
    const bool use_lock = cfg_.wakeup() == follower_wakeup::advisory_lock;
    std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                  pg::to_param(pg::as_bytea(c.rh_bytes)), pg::to_param(use_lock),
                                  pg::to_param(lock_class), pg::to_param(c.lock_key)};
    return parse_row(conn.exec_params(sql_.lookup, params, pg::format::binary));
}

// What a non-winning row means for this request.
engine::next engine::on_row(call &c, const claim_row &row) const
{
    const status_profile p = cfg_.profile();
    if (row.outcome == "replay")
    {
        response r;
        r.status = row.status.value_or(200);
        if (row.headers_json)
            r.headers = headers_from_json(*row.headers_json);
        r.headers.push_back({replay_header_name, "true"});
        r.body = row.body.value_or("");
        c.res.response = std::move(r);
        c.res.replayed = true;
        c.res.outcome = outcome::replay;
        return next::answer;
    }
    if (row.outcome == "not_replayable")
    {
        c.res.response = problems::not_replayable(p);
        c.res.outcome = outcome::conflict;
        return next::answer;
    }
    if (row.outcome == "mismatch")
    {
        c.res.response = problems::key_reused(p);
        c.res.outcome = outcome::conflict;
        return next::answer;
    }
    if (row.outcome == "cooldown")
    {
        emit(event::retryable_cooldown);
        c.res.response = problems::cooldown(p, row.retry_after.value_or(cfg_.retry_after()));
        c.res.outcome = outcome::failed;
        return next::answer;
    }
    if (row.outcome == "in_progress")
        return next::wait;
    if (row.outcome == "absent" || row.outcome == "claimable")
        return next::claim;
    throw pg::failure("pg_idem: unexpected claim outcome '" + row.outcome + "'");
}

void engine::wait_for_winner(call &c, pg::connection &conn, const claim_row &row) const
{
    start_waiting(c);
    if (cfg_.wakeup() == follower_wakeup::advisory_lock && row.lock_flag.has_value())
    {
        if (!*row.lock_flag)
        {
            // The winner holds the lock: sleep in the lock manager until it
            // lets go (finalized, released, died) or the slice is over.
            const milliseconds slice = std::min(remaining(c.deadline), cfg_.poll_max());
            try
            {
                conn.exec(wait_sql, lock_timeout_text(slice), lock_class, c.lock_key);
            }
            catch (const pg::lock_not_available &)
            {
            }
            catch (const pg::query_canceled &)
            {
            }
            c.rechecked = false;
            return;
        }
        if (!c.rechecked)
        {
            // Free lock: the winner may have unlocked between the read's
            // snapshot and the lock test. Read once more before sleeping.
            c.rechecked = true;
            return;
        }
    }
    milliseconds nap = jittered(c.backoff, cfg_.poll_jitter());
    if (row.retry_after)
        nap = std::min(nap, *row.retry_after + milliseconds(1));
    nap = std::min(nap, remaining(c.deadline));
    c.backoff = std::min(c.backoff * 2, cfg_.poll_max());
    if (nap.count() > 0)
        std::this_thread::sleep_for(nap);
}

run_result engine::loop(call &c, connection_handle conn, bool claim_first,
                        const win_fn &win) const
{
    bool do_claim = claim_first;
    unsigned broken = 0;
    for (;;)
    {
        if (++c.iterations > cfg_.max_iterations())
            return timed_out(c);
        claim_row row;
        try
        {
            if (!conn)
                conn = provider_.acquire();
            row = do_claim ? claim(c, *conn) : lookup(c, *conn);
        }
        catch (const pg::lock_not_available &)
        {
            // The key is locked by an idem_begin transaction for longer than
            // our budget.
            if (clock::now() >= c.deadline)
                return timed_out(c);
            continue;
        }
        catch (const pg::broken_connection &)
        {
            conn.reset();
            if (++broken > 1)
                return unavailable(c);
            continue;
        }
        catch (const pg::transaction_rollback &)
        {
            // The claim lost a race too often (40001 from idem_claim): try
            // again, bounded by the iteration cap.
            std::this_thread::sleep_for(jittered(cfg_.poll_min(), cfg_.poll_jitter()));
            continue;
        }
        catch (const std::exception &)
        {
            return unavailable(c);
        }
        broken = 0;
        if (do_claim && row.won())
            return win(c, std::move(conn), row);
        if (std::optional<run_result> r = follow(c, conn, row, do_claim))
            return std::move(*r);
    }
}

std::optional<run_result> engine::follow(call &c, connection_handle &conn, const claim_row &row,
                                         bool &do_claim) const
{
    next n;
    try
    {
        n = on_row(c, row);
    }
    catch (const std::exception &)
    {
        return unavailable(c);
    }
    switch (n)
    {
    case next::answer:
        return finish(c, c.res.outcome);
    case next::claim:
        do_claim = true;
        return std::nullopt;
    case next::wait:
        if (clock::now() >= c.deadline)
            return timed_out(c);
        try
        {
            if (conn)
                wait_for_winner(c, *conn, row);
        }
        catch (const pg::broken_connection &)
        {
            conn.reset();
        }
        catch (const std::exception &)
        {
            return unavailable(c);
        }
        do_claim = false;
        return std::nullopt;
    }
    return std::nullopt;
}

void engine::unlock(call &c, connection_handle &conn, bool held) const
{
    if (!held || !conn)
        return;
    try
    {
        conn->exec(unlock_sql, lock_class, c.lock_key);
    }
    catch (...)
    {
        // Never hand a connection back to the pool still holding our lock.
        conn->close();
    }
}

void engine::give_up_claim(call &c, connection_handle &conn, const std::string &claim_id,
                           storage_action action, bool *held) const
{
    bool scratch = false;
    bool &lock = held ? *held : scratch;
    try
    {
        if (!conn)
        {
            conn = provider_.acquire();
            lock = false;  // a session of its own: the old one took the lock with it
        }
        pg::result r = action == storage_action::fail
                           ? (lock ? conn->exec(sql_.fail_unlock, pg::as_bytea(c.ck_bytes), claim_id,
                                                cfg_.failure_cooldown(), lock_class, c.lock_key)
                                   : conn->exec(sql_.fail, pg::as_bytea(c.ck_bytes), claim_id,
                                                cfg_.failure_cooldown()))
                           : (lock ? conn->exec(sql_.release_unlock, pg::as_bytea(c.ck_bytes),
                                                claim_id, lock_class, c.lock_key)
                                   : conn->exec(sql_.release, pg::as_bytea(c.ck_bytes), claim_id));
        if (lock && !r.is_null(0, 1) && r.get_bool(0, 1))
            lock = false;  // released by the statement's commit
        if (r.is_null(0, 0) || !r.get_bool(0, 0))
        {
            emit(event::lease_stolen);
            c.res.lease_stolen = true;
        }
    }
    catch (const std::exception &)
    {
        emit(event::release_error);
        if (!c.res.error)
            c.res.error = std::current_exception();
        if (conn && !conn->is_open())
        {
            conn.reset();
            lock = false;  // went with the session
        }
    }
}

// After a lost connection: did our commit happen? Renewing the claim waits
// for a commit still in flight (it holds the row lock) and then tells
// whether the key is still ours (nothing was stored); otherwise the stored
// row says whether it holds our result.
settled engine::settle_by_reading(call &c, const std::string &claim_id,
                                  std::int64_t generation) const
{
    const auto deadline = clock::now() + cfg_.follower_wait_budget();
    for (unsigned attempt = 0; attempt < 3 && clock::now() < deadline; ++attempt)
    {
        try
        {
            connection_handle conn = provider_.acquire();
            pg::result r = conn->exec(sql_.probe_renew, pg::as_bytea(c.ck_bytes), claim_id,
                                      cfg_.lease(), lock_timeout_text(remaining(deadline)));
            if (!r.is_null(0, 0) && r.get_bool(0, 0))
                return settled::not_committed;
            const claim_row row = lookup(c, *conn);
            const bool ours = row.generation == 0 || generation == 0 || row.generation == generation;
            if (row.outcome == "replay" && ours)
                return settled::committed;
            if (row.outcome == "not_replayable" && ours)
                return settled::committed_uncached;
            return settled::lost;
        }
        catch (const pg::lock_not_available &)
        {
            return settled::unknown;
        }
        catch (const pg::query_canceled &)
        {
            return settled::unknown;
        }
        catch (const std::exception &)
        {
            if (!c.res.error)
                c.res.error = std::current_exception();
            std::this_thread::sleep_for(cfg_.poll_min());
        }
    }
    return settled::unknown;
}

std::vector<pg::param> engine::finalize_params(const call &c, const std::string &claim_id,
                                               const response &resp, bool strict) const
{
    const bool over_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
    // Over the client's cap one byte is enough for the server to record
    // "completed, not replayable" (see statements::finalize).
    const std::string_view body =
        over_cap ? std::string_view(resp.body).substr(0, 1) : std::string_view(resp.body);
    return {pg::to_param(pg::as_bytea(c.ck_bytes)),
            pg::to_param(claim_id),
            pg::to_param(resp.status),
            pg::to_param(allow_.to_json(resp.headers)),
            pg::to_param(pg::as_bytea(body)),
            pg::to_param(strict),
            pg::to_param(over_cap)};
}

// ---- standard mode ------------------------------------------------------------

run_result engine::run(const request_view &req, const handler &h) const
{
    call c;
    bool unguarded = false;
    if (auto early = prepare(req, c, unguarded))
        return std::move(*early);
    if (unguarded)
    {
        c.res.handler_ran = true;
        try
        {
            c.res.response = h(claim_context());
        }
        catch (...)
        {
            finish(c, outcome::failed);
            throw;
        }
        return finish(c, outcome::unguarded);
    }
    connection_handle conn;
    try
    {
        conn = provider_.acquire();
    }
    catch (const std::exception &)
    {
        return unavailable(c);
    }
    return loop(c, std::move(conn), true,
                [&](call &cc, connection_handle cn, claim_row &row) {
                    return win_standard(cc, std::move(cn), row, h);
                });
}

static void report_win(const engine &e, const claim_row &row)
{
    if (row.outcome == "claimed")
        e.emit(event::claimed);
    else if (row.outcome == "recovered_ttl")
        e.emit(event::recovered_ttl);
    else
        e.emit(event::recovered_abandoned);
}

run_result engine::win_standard(call &c, connection_handle conn, claim_row &row,
                                const handler &h) const
{
    report_win(*this, row);
    c.res.generation = row.generation;
    lease_keeper keeper(*this, c, row.claim_id, std::move(conn), row.lock_flag.value_or(false));
    claim_context ctx(row.generation, row.claim_id, c.ck, keeper.lost_flag());
    keeper.start();
    response resp;
    try
    {
        c.res.handler_ran = true;
        resp = h(ctx);
    }
    catch (...)
    {
        keeper.stop();
        connection_handle cn = keeper.take_connection();
        bool held = keeper.lock_held();
        give_up_claim(c, cn, row.claim_id, storage_action::fail, &held);
        unlock(c, cn, held);
        finish(c, outcome::failed);
        throw;
    }
    keeper.stop();
    conn = keeper.take_connection();
    // The finalize (or release, fail) normally runs on the connection that
    // holds the wake-up lock and releases it at its commit: no unlock round
    // trip. unlock() is the fallback for every other path.
    bool held = keeper.lock_held();
    store_standard(c, conn, held, row.claim_id, row.generation, resp);
    unlock(c, conn, held);
    c.res.response = std::move(resp);
    return finish(c, c.res.outcome);
}

void engine::store_standard(call &c, connection_handle &conn, bool &held,
                            const std::string &claim_id, std::int64_t generation,
                            const response &resp) const
{
    const storage_action action = classify(resp.status);
    if (action != storage_action::finalize)
    {
        give_up_claim(c, conn, claim_id, action, &held);
        c.res.outcome = action == storage_action::fail ? outcome::failed : outcome::won_completed;
        return;
    }
    const bool over_client_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
    const std::vector<pg::param> params = finalize_params(c, claim_id, resp, false);
    for (unsigned attempt = 0; attempt < 2; ++attempt)
    {
        try
        {
            if (!conn)
            {
                conn = provider_.acquire();
                held = false;
            }
            pg::result r;
            if (held)
            {
                std::vector<pg::param> with_lock = params;
                with_lock.push_back(pg::to_param(lock_class));
                with_lock.push_back(pg::to_param(c.lock_key));
                r = conn->exec_params(sql_.finalize_unlock, with_lock);
                if (!r.is_null(0, 2) && r.get_bool(0, 2))
                    held = false;  // released by the finalize's commit
            }
            else
                r = conn->exec_params(sql_.finalize, params);
            if (r.is_null(0, 0) || !r.get_bool(0, 0))
            {
                emit(event::lease_stolen);
                c.res.lease_stolen = true;
                c.res.outcome = outcome::won_completed;
                return;
            }
            emit(event::finalized);
            const auto server_cap = parse_size_setting(r.get_optional_text(0, 1));
            const bool uncached = over_client_cap || (server_cap && resp.body.size() > *server_cap);
            c.res.outcome = uncached ? outcome::completed_uncacheable : outcome::won_completed;
            return;
        }
        catch (const pg::broken_connection &)
        {
            // The finalize may have committed: read the key, never re-run.
            // The wake-up lock went with the session.
            conn.reset();
            held = false;
            emit(event::unknown_outcome);
            switch (settle_by_reading(c, claim_id, generation))
            {
            case settled::committed:
                emit(event::finalized);
                c.res.outcome = over_client_cap ? outcome::completed_uncacheable
                                                : outcome::won_completed;
                return;
            case settled::committed_uncached:
                emit(event::finalized);
                c.res.outcome = outcome::completed_uncacheable;
                return;
            case settled::not_committed:
                continue;  // still ours: store it again
            case settled::lost:
                emit(event::lease_stolen);
                c.res.lease_stolen = true;
                c.res.outcome = outcome::won_completed;
                return;
            case settled::unknown:
                c.res.outcome_unknown = true;
                c.res.outcome = outcome::failed;
                return;
            }
        }
        catch (const std::exception &)
        {
            emit(event::finalize_error);
            c.res.error = std::current_exception();
            if (conn && !conn->is_open())
            {
                conn.reset();
                held = false;
            }
            // An error from the finalize itself leaves the session holding
            // the lock (it is handed over only after idem_finalize returned):
            // the release drops it at its commit, or unlock() does after.
            give_up_claim(c, conn, claim_id, storage_action::release, &held);
            c.res.outcome = outcome::failed;
            return;
        }
    }
    emit(event::finalize_error);
    c.res.outcome = outcome::failed;
}

// ---- fenced mode ----------------------------------------------------------------

run_result engine::unguarded_tx(call &c, const transaction_handler &h, pg::isolation level) const
{
    retry_policy policy;
    policy.attempts = cfg_.transaction_attempts();
    c.res.response = transact(
        provider_,
        [&](pg::transaction &tx) {
            c.res.handler_ran = true;
            return h(tx, claim_context());
        },
        policy, level);
    return finish(c, outcome::unguarded);
}

run_result engine::run_fenced(const request_view &req, const transaction_handler &h,
                              pg::isolation level) const
{
    call c;
    bool unguarded = false;
    if (auto early = prepare(req, c, unguarded))
        return std::move(*early);
    if (unguarded)
        return unguarded_tx(c, h, level);
    connection_handle conn;
    try
    {
        conn = provider_.acquire();
    }
    catch (const std::exception &)
    {
        return unavailable(c);
    }
    return loop(c, std::move(conn), true,
                [&](call &cc, connection_handle cn, claim_row &row) {
                    return win_fenced(cc, std::move(cn), row, h, level);
                });
}

run_result engine::win_fenced(call &c, connection_handle conn, claim_row &row,
                              const transaction_handler &h, pg::isolation level) const
{
    report_win(*this, row);
    c.res.generation = row.generation;
    lease_keeper keeper(*this, c, row.claim_id, std::move(conn), row.lock_flag.value_or(false));
    claim_context ctx(row.generation, row.claim_id, c.ck, keeper.lost_flag());
    keeper.start();

    // What is left to do with the claim once the handler transaction is over.
    enum class after
    {
        done,     // stored with the transaction
        give_up,  // release or fail it
        follow,   // lost it (IL001): answer from the key like a follower
        unknown   // commit outcome unresolved: leave the key alone
    } todo = after::give_up;
    storage_action action = storage_action::fail;
    outcome result = outcome::failed;
    response resp;
    std::exception_ptr rethrow;

    for (unsigned attempt = 1;; ++attempt)
    {
        try
        {
            connection_handle tx_conn = provider_.acquire();
            pg::transaction tx(*tx_conn, level);
            c.res.handler_ran = true;
            resp = h(tx, ctx);
            action = classify(resp.status);
            if (action == storage_action::fail)
            {
                tx.rollback();  // a failure leaves none of its writes behind
                result = outcome::failed;
                break;
            }
            if (action == storage_action::release)
            {
                try
                {
                    tx.commit();
                }
                catch (const pg::unknown_outcome &)
                {
                    emit(event::unknown_outcome);
                    c.res.outcome_unknown = true;
                }
                result = outcome::won_completed;
                break;
            }
            const bool over_client_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
            // The fence: the last statement of the transaction raises IL001
            // if the claim is no longer ours, taking the handler's writes down.
            pg::result r = tx.exec_params(sql_.finalize, finalize_params(c, row.claim_id, resp, true));
            const auto server_cap = parse_size_setting(r.get_optional_text(0, 1));
            std::optional<settled> s;
            try
            {
                tx.commit();
            }
            catch (const pg::unknown_outcome &)
            {
                emit(event::unknown_outcome);
                s = settle_by_reading(c, row.claim_id, row.generation);
            }
            if (!s || *s == settled::committed || *s == settled::committed_uncached)
            {
                emit(event::finalized);
                const bool uncached = over_client_cap ||
                                      (server_cap && resp.body.size() > *server_cap) ||
                                      (s && *s == settled::committed_uncached);
                result = uncached ? outcome::completed_uncacheable : outcome::won_completed;
                todo = after::done;
            }
            else if (*s == settled::not_committed)
            {
                // Nothing happened, domain writes included: free the key and
                // ask the client to retry. Never run the handler again here.
                action = storage_action::release;
                resp = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
                result = outcome::failed;
            }
            else if (*s == settled::lost)
                todo = after::follow;
            else
            {
                todo = after::unknown;
                c.res.outcome_unknown = true;
                resp = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
                result = outcome::failed;
            }
            break;
        }
        catch (const pg::lease_lost &)
        {
            emit(event::lease_stolen);
            c.res.lease_stolen = true;
            todo = after::follow;
            break;
        }
        catch (const pg::transaction_rollback &e)
        {
            const bool transient = dynamic_cast<const pg::serialization_failure *>(&e) ||
                                   dynamic_cast<const pg::deadlock_detected *>(&e);
            if (transient && attempt < cfg_.transaction_attempts())
                continue;  // rolled back, claim still ours: run it again
            rethrow = std::current_exception();
            action = storage_action::fail;
            break;
        }
        catch (const pg::broken_connection &)
        {
            // Lost before COMMIT was sent: the transaction died with the
            // session, so running it again cannot do it twice.
            if (attempt < cfg_.transaction_attempts())
                continue;
            rethrow = std::current_exception();
            action = storage_action::fail;
            break;
        }
        catch (...)
        {
            rethrow = std::current_exception();
            action = storage_action::fail;
            break;
        }
    }

    keeper.stop();
    connection_handle cn = keeper.take_connection();
    // The handler's transaction ran on another connection: after its commit,
    // the lock's session drops the lock with a statement of its own (or with
    // the release / fail, when there is one).
    bool held = keeper.lock_held();
    if (todo == after::give_up)
        give_up_claim(c, cn, row.claim_id, action, &held);
    unlock(c, cn, held);
    if (rethrow)
    {
        finish(c, outcome::failed);
        std::rethrow_exception(rethrow);
    }
    if (todo == after::follow)
    {
        c.deadline = clock::now() + cfg_.follower_wait_budget();
        return loop(c, std::move(cn), false,
                    [&](call &cc, connection_handle cn2, claim_row &row2) {
                        return win_fenced(cc, std::move(cn2), row2, h, level);
                    });
    }
    c.res.response = std::move(resp);
    return finish(c, result);
}

// ---- in-transaction mode --------------------------------------------------------

run_result engine::run_in_tx(const request_view &req, const transaction_handler &h,
                             pg::isolation level) const
{
    call c;
    bool unguarded = false;
    if (auto early = prepare(req, c, unguarded))
        return std::move(*early);
    if (unguarded)
        return unguarded_tx(c, h, level);

    const bool use_lock = cfg_.wakeup() == follower_wakeup::advisory_lock;
    connection_handle conn;
    bool do_claim = true;
    unsigned attempts = 0, broken = 0;
    for (;;)
    {
        if (++c.iterations > cfg_.max_iterations())
            return timed_out(c);
        claim_row row;
        std::optional<pg::transaction> tx;
        try
        {
            if (!conn)
                conn = provider_.acquire();
            if (!do_claim)
                row = lookup(c, *conn);
            else
            {
                tx.emplace(*conn, level);
                // Duplicates wait inside idem_begin for the first transaction;
                // bound that wait by our budget, then restore the caller's setting.
                pg::result lt = tx->exec(get_lock_timeout_sql, lock_timeout_text(remaining(c.deadline)));
                std::vector<pg::param> params{
                    pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(pg::as_bytea(c.rh_bytes)),
                    pg::to_param(use_lock), pg::to_param(lock_class), pg::to_param(c.lock_key)};
                row = parse_row(tx->exec_params(sql_.begin, params, pg::format::binary));
                tx->exec(set_lock_timeout_sql, lt.get_text(0, 0));
            }
        }
        catch (const pg::lock_not_available &)
        {
            tx.reset();
            if (clock::now() >= c.deadline)
                return timed_out(c);
            continue;
        }
        catch (const pg::transaction_rollback &)
        {
            tx.reset();  // e.g. 40001 from idem_begin under REPEATABLE READ
            if (++attempts >= cfg_.transaction_attempts())
                return unavailable(c);
            continue;
        }
        catch (const pg::broken_connection &)
        {
            tx.reset();
            conn.reset();
            if (++broken > 1)
                return unavailable(c);
            continue;
        }
        catch (const std::exception &)
        {
            return unavailable(c);
        }
        broken = 0;

        if (do_claim && row.won())
        {
            report_win(*this, row);
            c.res.generation = row.generation;
            claim_context ctx(row.generation, row.claim_id, c.ck);
            response resp;
            storage_action action = storage_action::fail;
            try
            {
                tx->exec("SAVEPOINT idem_handler");
                c.res.handler_ran = true;
                resp = h(*tx, ctx);
                action = classify(resp.status);
                const bool over_client_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
                std::optional<std::size_t> server_cap;
                if (action == storage_action::finalize)
                {
                    pg::result r =
                        tx->exec_params(sql_.finalize, finalize_params(c, row.claim_id, resp, true));
                    server_cap = parse_size_setting(r.get_optional_text(0, 1));
                }
                else if (action == storage_action::release)
                    tx->exec(sql_.release, pg::as_bytea(c.ck_bytes), row.claim_id);
                else
                {
                    // A failure keeps none of the handler's writes but does
                    // keep the cooldown.
                    tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
                    tx->exec(sql_.fail, pg::as_bytea(c.ck_bytes), row.claim_id,
                             cfg_.failure_cooldown());
                }
                try
                {
                    tx->commit();
                }
                catch (const pg::unknown_outcome &)
                {
                    emit(event::unknown_outcome);
                    // Run idem_begin again and roll it back: it waits for a
                    // commit still in flight, then says what is stored.
                    try
                    {
                        connection_handle probe = provider_.acquire();
                        pg::transaction ptx(*probe);
                        ptx.exec(get_lock_timeout_sql, lock_timeout_text(cfg_.follower_wait_budget()));
                        std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                                      pg::to_param(pg::as_bytea(c.rh_bytes)),
                                                      pg::to_param(false), pg::to_param(lock_class),
                                                      pg::to_param(c.lock_key)};
                        claim_row seen = parse_row(ptx.exec_params(sql_.begin, params, pg::format::binary));
                        ptx.rollback();
                        const bool stored = seen.outcome == "replay" || seen.outcome == "not_replayable";
                        if (!stored && action == storage_action::finalize)
                        {
                            // Not committed: nothing happened. Ask for a retry.
                            c.res.response = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
                            return finish(c, outcome::failed);
                        }
                    }
                    catch (const std::exception &)
                    {
                        c.res.outcome_unknown = true;
                        c.res.error = std::current_exception();
                        c.res.response = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
                        return finish(c, outcome::failed);
                    }
                }
                c.res.response = std::move(resp);
                if (action == storage_action::finalize)
                {
                    emit(event::finalized);
                    const bool uncached = over_client_cap ||
                                          (server_cap && c.res.response.body.size() > *server_cap);
                    return finish(c, uncached ? outcome::completed_uncacheable
                                              : outcome::won_completed);
                }
                return finish(c, action == storage_action::fail ? outcome::failed
                                                                : outcome::won_completed);
            }
            catch (const pg::transaction_rollback &e)
            {
                const bool transient = dynamic_cast<const pg::serialization_failure *>(&e) ||
                                       dynamic_cast<const pg::deadlock_detected *>(&e);
                tx.reset();
                if (transient && ++attempts < cfg_.transaction_attempts())
                    continue;  // everything rolled back, the claim too
                finish(c, outcome::failed);
                throw;
            }
            catch (const pg::broken_connection &)
            {
                // Lost before COMMIT: the claim and the writes died with the session.
                tx.reset();
                conn.reset();
                if (++attempts < cfg_.transaction_attempts())
                    continue;
                finish(c, outcome::failed);
                throw;
            }
            catch (...)
            {
                // The handler threw (or storing failed): keep a cooldown, drop its writes.
                std::exception_ptr err = std::current_exception();
                try
                {
                    if (tx && tx->active())
                    {
                        tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
                        tx->exec(sql_.fail, pg::as_bytea(c.ck_bytes), row.claim_id,
                                 cfg_.failure_cooldown());
                        tx->commit();
                    }
                }
                catch (...)
                {
                    emit(event::release_error);
                }
                tx.reset();
                finish(c, outcome::failed);
                std::rethrow_exception(err);
            }
        }

        if (tx)
        {
            try
            {
                tx->rollback();
            }
            catch (...)
            {
            }
            tx.reset();
        }
        if (std::optional<run_result> r = follow(c, conn, row, do_claim))
            return std::move(*r);
    }
}

}  // namespace detail

// ---- runner ---------------------------------------------------------------------

runner::runner(connection_provider &provider, config cfg, metrics *observer)
    : engine_(std::make_shared<const detail::engine>(provider, std::move(cfg), observer))
{
}

run_result runner::run(const request_view &req, const handler &h) const
{
    return engine_->run(req, h);
}

run_result runner::run_fenced(const request_view &req, const transaction_handler &h,
                              pg::isolation level) const
{
    return engine_->run_fenced(req, h, level);
}

run_result runner::run_in_transaction(const request_view &req, const transaction_handler &h,
                                      pg::isolation level) const
{
    return engine_->run_in_tx(req, h, level);
}

const config &runner::settings() const noexcept { return engine_->cfg(); }

}  // namespace idem
