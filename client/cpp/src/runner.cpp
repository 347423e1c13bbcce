// The single-flight runner: lease mode (run) and idem::runner itself. The
// engine is declared in runner_engine.hpp, which describes the design.
#include "runner_engine.hpp"

namespace idem {

namespace detail {

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

void report_win(const engine &e, const claim_row &row)
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
                r = qp(*conn, sql_.finalize_unlock, with_lock);
                if (!r.is_null(0, 2) && r.get_bool(0, 2))
                    held = false;  // released by the finalize's commit
            }
            else
                r = qp(*conn, sql_.finalize, params);
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

