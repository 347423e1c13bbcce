// The winner's renewal thread (lease_keeper).
#include "runner_engine.hpp"

namespace idem::detail {

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
                lock_held_ = e_.q(*conn_, try_lock_sql, lock_class, c_.lock_key).get_bool(0, 0);
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
                pg::result r = e_.q(*conn_, e_.sql().renew, pg::as_bytea(c_.ck_bytes), claim_id_,
                                           cfg.lease(), lock_timeout_text(cfg.renew_interval()));
                if (r.is_null(0, 0) || !r.get_bool(0, 0))
                {
                    // Taken over: stop renewing and let followers look.
                    lost_->store(true);
                    if (lock_held_)
                    {
                        try
                        {
                            e_.q(*conn_, unlock_sql, lock_class, c_.lock_key);
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

}  // namespace idem::detail
