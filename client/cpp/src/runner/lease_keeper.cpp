// The winner's renewal thread (lease_keeper).
#include "runner/engine.hpp"

namespace idem::detail {

// ---- lease keeper ----------------------------------------------------------

lease_keeper::lease_keeper(const engine &e, call &c, std::string claim_id, connection_handle conn)
    : e_(e), c_(c), claim_id_(std::move(claim_id)), conn_(std::move(conn))
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
    auto next_renew = clock::now() + cfg.renew_interval();
    for (;;)
    {
        {
            std::unique_lock<std::mutex> lk(mu_);
            if (cv_.wait_until(lk, next_renew, [this] { return stopping_; }))
                return;
        }
        const auto now = clock::now();
        try
        {
            if (!conn_)
                conn_ = e_.provider().acquire();
            pg::result r = e_.q(*conn_, e_.calls(*conn_).renew, pg::as_bytea(c_.ck_bytes), claim_id_,
                                cfg.lease(), lock_wait_text(cfg.renew_interval()));
            if (r.is_null(0, 0) || !r.get_bool(0, 0))
            {
                // Taken over: stop renewing (a long handler may look at lost()).
                lost_->store(true);
                return;
            }
            next_renew = now + cfg.renew_interval();
        }
        catch (const std::exception &)
        {
            // A lost connection, lock_timeout, or the database unreachable:
            // try again sooner than usual, but never in a tight loop.
            if (conn_ && !conn_->is_open())
                conn_.reset();
            next_renew = now + std::max(milliseconds(1), cfg.renew_interval() / 4);
        }
    }
}

}  // namespace idem::detail
