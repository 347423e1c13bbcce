// The outbox drainer: claim, publish, ack and nack, wait, stop.
#include <idem/outbox.hpp>
#include <idem/protocol.hpp>

#include "messaging/detail.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

namespace idem {

namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The statements, qualified with the configured schema.
struct outbox_sql
{
    std::string claim, ack, nack, wait;

    explicit outbox_sql(const std::string &schema)
        : claim("SELECT id, topic, key, payload::text, payload_bytes, headers::text, attempts,"
                " created_at::text, claim_token::text, lease_expires_at::text FROM " +
                detail::qualified(schema, "idem_outbox_claim") + "($1, $2)"),
          ack("SELECT " + detail::qualified(schema, "idem_outbox_ack") + "($1::uuid, $2::bigint[])"),
          nack("SELECT n.outcome FROM " + detail::qualified(schema, "idem_outbox_nack") +
               "($1::uuid, $2::bigint, $3) n"),
          wait("SELECT " + detail::qualified(schema, "idem_outbox_wait") + "($1)")
    {
    }
};

// One row of the claim statement, typed for the publisher.
outbox_event event_of(const pg::result &r, std::size_t row)
{
    outbox_event e;
    e.id = r.get_int(row, 0);
    e.topic = r.get_text(row, 1);
    e.key = r.get_optional_text(row, 2);
    e.payload = r.get_optional_text(row, 3);
    if (!r.is_null(row, 4))
        e.payload_bytes = r.get_bytea(row, 4);
    e.headers = r.get_optional_text(row, 5);
    e.attempts = static_cast<int>(r.get_int(row, 6));
    e.created_at = r.get_text(row, 7);
    e.claim_token = r.get_text(row, 8);
    e.lease_expires_at = r.get_text(row, 9);
    return e;
}

// A bigint[] literal for idem_outbox_ack.
std::string id_array(const std::vector<std::int64_t> &ids)
{
    std::string out = "{";
    for (std::size_t i = 0; i < ids.size(); ++i)
        out += (i ? "," : "") + std::to_string(ids[i]);
    return out + "}";
}

// Runs a statement again when it was canceled: a cancel request meant for
// idem_outbox_wait (see state::stop) can land on the statement after it.
template <typename... Args>
pg::result exec_uncanceled(pg::connection &c, const std::string &sql, Args &&...args)
{
    try
    {
        return c.exec(sql, args...);
    }
    catch (const pg::query_canceled &)
    {
        return c.exec(sql, args...);
    }
}

bool in_range(milliseconds v, milliseconds lo, milliseconds hi) { return v >= lo && v <= hi; }

// Longest single idem_outbox_wait statement (see state::wait_for_work).
constexpr milliseconds max_wait_slice{1000};

}  // namespace

batch_report &batch_report::operator+=(const batch_report &o)
{
    claimed += o.claimed;
    published += o.published;
    acked += o.acked;
    lease_lost += o.lease_lost;
    retried += o.retried;
    dead += o.dead;
    stale += o.stale;
    held_back += o.held_back;
    expired += o.expired;
    abandoned += o.abandoned;
    return *this;
}

void drainer_settings::validate() const
{
    using std::chrono::hours;
    if (batch < 1 || batch > 10000)
        throw config_error("drainer: batch must be between 1 and 10000");
    if (!in_range(lease, milliseconds(10), hours(24)))
        throw config_error("drainer: lease must be between 10 ms and 24 h");
    if (lease_margin && (lease_margin->count() < 0 || *lease_margin >= lease))
        throw config_error("drainer: lease_margin must be at least 0 and less than the lease");
    if (!in_range(idle_wait, milliseconds(1), hours(1)))
        throw config_error("drainer: idle_wait must be between 1 ms and 1 h");
    if (!in_range(error_backoff, milliseconds(1), hours(1)))
        throw config_error("drainer: error_backoff must be between 1 ms and 1 h");
    if (max_error_bytes < 16 || max_error_bytes > 1024 * 1024)
        throw config_error("drainer: max_error_bytes must be between 16 and 1 MiB");
    detail::check_schema(schema, "drainer");
}

milliseconds drainer_settings::effective_lease_margin() const
{
    return lease_margin ? *lease_margin : lease / 5;
}

struct drainer::state
{
    state(connection_provider &p, publisher pub, drainer_settings s)
        : provider(p), publish(std::move(pub)), settings(std::move(s)), sql(settings.schema)
    {
    }

    connection_provider &provider;
    publisher publish;
    drainer_settings settings;
    outbox_sql sql;

    std::atomic<bool> stopping{false};
    std::atomic<bool> running{false};
    mutable std::mutex mu;  // guards cancel, totals; with wake for sleeps
    std::condition_variable wake;
    PGcancel *cancel = nullptr;  // set while run() waits in idem_outbox_wait
    batch_report total;

    // One event through the publisher; exceptions become failures.
    publish_result publish_one(const outbox_event &e)
    {
        try
        {
            return publish(e);
        }
        catch (...)
        {
            return publish_result::failed(detail::describe(std::current_exception()));
        }
    }

    batch_report drain(pg::connection &c)
    {
        batch_report rep;
        const auto sent = clock::now();
        pg::result res = exec_uncanceled(c, sql.claim, settings.batch, settings.lease);
        rep.claimed = res.size();
        if (rep.claimed == 0)
            return rep;
        const auto deadline = sent + settings.lease - settings.effective_lease_margin();
        const std::string token = res.get_text(0, 8);

        std::vector<std::int64_t> published;
        std::vector<std::pair<std::int64_t, std::string>> failed;
        std::set<std::string> blocked_keys;
        for (std::size_t i = 0; i < res.size(); ++i)
        {
            const outbox_event e = event_of(res, i);
            if (stopping.load() && settings.on_stop == stop_mode::abandon_rest)
            {
                ++rep.abandoned;
                continue;
            }
            if (clock::now() >= deadline)
            {
                ++rep.expired;
                continue;
            }
            if (e.key && blocked_keys.count(*e.key))
            {
                ++rep.held_back;
                continue;
            }
            publish_result pr = publish_one(e);
            if (pr.is_ok())
            {
                published.push_back(e.id);
                ++rep.published;
                continue;
            }
            if (e.key)
                blocked_keys.insert(*e.key);
            failed.emplace_back(e.id, detail::error_text(pr.error().empty() ? "publish failed" : pr.error(),
                                                         settings.max_error_bytes));
        }

        // Ack first: a published event not acked is published again.
        if (!published.empty())
        {
            pg::result a = exec_uncanceled(c, sql.ack, token, id_array(published));
            rep.acked = static_cast<std::size_t>(a.get_int(0, 0));
            rep.lease_lost = published.size() - rep.acked;
        }
        for (const auto &[id, error] : failed)
        {
            switch (protocol::parse_nack_outcome(exec_uncanceled(c, sql.nack, token, id, error).get_text(0, 0)))
            {
            case protocol::nack_outcome::retry:
                ++rep.retried;
                break;
            case protocol::nack_outcome::dead:
                ++rep.dead;
                break;
            case protocol::nack_outcome::stale:
            case protocol::nack_outcome::unknown:
                ++rep.stale;
                break;
            }
        }
        {
            std::lock_guard<std::mutex> lk(mu);
            total += rep;
        }
        if (settings.on_batch)
            settings.on_batch(rep);
        return rep;
    }

    // idem_outbox_wait for up to idle_wait, cancelable by stop(). False when
    // stopped. A cancel request that reaches the backend before the
    // statement starts is ignored by the server, so the wait runs in slices
    // of at most max_wait_slice: stop() then takes effect within one slice.
    bool wait_for_work(pg::connection &c)
    {
        const auto until = clock::now() + settings.idle_wait;
        for (;;)
        {
            const auto left = std::chrono::duration_cast<milliseconds>(until - clock::now());
            if (left.count() <= 0)
                return !stopping.load();
            const std::optional<bool> found = wait_slice(c, std::min(left, max_wait_slice));
            if (!found)
                return false;
            if (*found)
                return true;
        }
    }

    // One idem_outbox_wait statement: whether work is claimable, nullopt
    // when stopped.
    std::optional<bool> wait_slice(pg::connection &c, milliseconds d)
    {
        PGcancel *handle = PQgetCancel(c.native_handle());
        if (!handle)
            throw pg::broken_connection("cannot make a cancel request: " + c.error_message());
        {
            std::lock_guard<std::mutex> lk(mu);
            if (stopping.load())
            {
                PQfreeCancel(handle);
                return std::nullopt;
            }
            cancel = handle;
        }
        struct unregister
        {
            state &s;
            ~unregister()
            {
                std::lock_guard<std::mutex> lk(s.mu);
                PQfreeCancel(s.cancel);
                s.cancel = nullptr;
            }
        } guard{*this};
        bool found = false;
        try
        {
            found = c.exec(sql.wait, d).get_bool(0, 0);
        }
        catch (const pg::query_canceled &)
        {
            if (stopping.load())
                return std::nullopt;
            throw;
        }
        if (stopping.load())
            return std::nullopt;
        return found;
    }

    void request_stop() noexcept
    {
        std::lock_guard<std::mutex> lk(mu);
        stopping.store(true);
        if (cancel)
        {
            char err[256];
            PQcancel(cancel, err, sizeof(err));  // best effort: the wait ends by itself anyway
        }
        wake.notify_all();
    }

    // Sleeps d or until stop().
    void pause(milliseconds d)
    {
        std::unique_lock<std::mutex> lk(mu);
        wake.wait_for(lk, d, [&] { return stopping.load(); });
    }
};

drainer::drainer(connection_provider &provider, publisher publish, drainer_settings settings)
{
    if (!publish)
        throw config_error("drainer: the publisher must not be empty");
    settings.validate();
    s_ = std::make_unique<state>(provider, std::move(publish), std::move(settings));
}

drainer::~drainer() = default;

batch_report drainer::drain_once()
{
    connection_handle conn = s_->provider.acquire();
    return s_->drain(*conn);
}

void drainer::run()
{
    if (s_->running.exchange(true))
        throw std::logic_error("drainer::run: already running on another thread");
    struct clear_running
    {
        std::atomic<bool> &flag;
        ~clear_running() { flag.store(false); }
    } guard{s_->running};

    connection_handle conn;
    while (!s_->stopping.load())
    {
        try
        {
            if (!conn)
                conn = s_->provider.acquire();
            if (s_->drain(*conn).claimed > 0)
                continue;
            if (!s_->wait_for_work(*conn))
                break;
        }
        catch (const pg::failure &)
        {
            if (s_->settings.on_error)
                s_->settings.on_error(std::current_exception());
            if (conn && (!conn->is_open() || conn->status() != pg::transaction_status::idle))
                conn->close();
            conn.reset();
            s_->pause(s_->settings.error_backoff);
        }
    }
}

void drainer::stop() noexcept { s_->request_stop(); }

bool drainer::stop_requested() const noexcept { return s_->stopping.load(); }

batch_report drainer::totals() const
{
    std::lock_guard<std::mutex> lk(s_->mu);
    return s_->total;
}

}  // namespace idem
