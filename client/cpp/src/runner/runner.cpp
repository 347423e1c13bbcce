// The single-flight runner: lease mode (run) and idem::runner itself. The
// engine is declared in engine.hpp, which describes the design.
#include "runner/engine.hpp"

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
    if (row.kind == protocol::server_outcome::claimed)
        e.emit(event::claimed);
    else if (row.kind == protocol::server_outcome::recovered_ttl)
        e.emit(event::recovered_ttl);
    else
        e.emit(event::recovered_abandoned);
}

run_result engine::win_standard(call &c, connection_handle conn, claim_row &row,
                                const handler &h) const
{
    report_win(*this, row);
    c.res.generation = row.generation;
    lease_keeper keeper(*this, c, row.claim_id, std::move(conn));
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
        give_up_claim(c, cn, row.claim_id, storage_action::fail);
        finish(c, outcome::failed);
        throw;
    }
    keeper.stop();
    conn = keeper.take_connection();
    // Followers waiting in idem_claim wake when the finalize (or release,
    // fail) commits; nothing else to tell them.
    store_standard(c, conn, row.claim_id, row.generation, resp);
    // Not stored: the caller is told so, never given a response that a
    // retry could not replay.
    c.res.response = c.res.outcome_unknown
                         ? problems::outcome_unknown(cfg_.profile(), cfg_.retry_after())
                         : std::move(resp);
    return finish(c, c.res.outcome);
}

void engine::store_standard(call &c, connection_handle &conn, const std::string &claim_id, std::int64_t generation,
                            const response &resp) const
{
    const storage_action action = classify(resp.status, cfg_.client_errors());
    if (action != storage_action::finalize)
    {
        give_up_claim(c, conn, claim_id, action);
        c.res.outcome = action == storage_action::fail ? outcome::failed : outcome::won_completed;
        return;
    }
    const bool over_client_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
    const std::vector<pg::param> params = finalize_params(c, claim_id, resp, false);
    // The handler has run: whatever goes wrong from here, the key is never
    // released or failed (a duplicate would run the handler again). A
    // failed finalize is sent again on a fresh connection, as an unnamed
    // statement (a pooler's prepared-statement clash, 42P05 / 26000, is
    // the usual cause), after reading the key tells that it is still ours
    // and holds nothing; what cannot be stored is left pending to its
    // lease, and the same request recovers it after that.
    pg::preparation how = cfg_.prepared_statements();
    for (unsigned attempt = 0; attempt < store_attempts; ++attempt)
    {
        try
        {
            if (!conn)
                conn = provider_.acquire();
            pg::result r = conn->exec_prepared(sql_.finalize, params, pg::format::text, how);
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
            conn.reset();
            emit(event::unknown_outcome);
        }
        catch (const std::exception &e)
        {
            // Refused by the server (nothing stored), or no connection.
            emit(event::finalize_error);
            c.res.error = std::current_exception();
            report(c.res.error, "finalize");
            if (conn && (!conn->is_open() || is_prepared_statement_error(e)))
                conn->close();  // its statement names are not the server's: the pool drops it
            conn.reset();
            how = pg::preparation::unnamed;
        }
        switch (settle_by_reading(c, claim_id, generation))
        {
        case settled::committed:
            emit(event::finalized);
            c.res.outcome = over_client_cap ? outcome::completed_uncacheable : outcome::won_completed;
            return;
        case settled::committed_uncached:
            emit(event::finalized);
            c.res.outcome = outcome::completed_uncacheable;
            return;
        case settled::not_committed:
            continue;  // still ours, nothing stored: store it again
        case settled::lost:
            emit(event::lease_stolen);
            c.res.lease_stolen = true;
            c.res.outcome = outcome::won_completed;
            return;
        case settled::unknown:
            attempt = store_attempts;
            break;
        }
    }
    c.res.outcome_unknown = true;
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

