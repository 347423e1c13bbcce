// In-transaction mode: idem_begin, the handler and the finalize in one
// transaction.
#include "runner/engine.hpp"

namespace idem::detail {

// ---- in-transaction mode --------------------------------------------------------

// After the handler threw or its result could not be stored: roll its
// writes back to the savepoint and commit the claim failed, with a cooldown.
void engine::keep_cooldown(call &c, std::optional<pg::transaction> &tx,
                           const std::string &claim_id) const
{
    try
    {
        if (tx && tx->active() && tx->conn().is_open())
        {
            tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
            qu(*tx, sql_.fail,
               {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(claim_id),
                pg::to_param(cfg_.failure_cooldown())});
            tx->commit();
        }
    }
    catch (...)
    {
        emit(event::release_error);
    }
    tx.reset();
}

run_result engine::run_in_tx(const request_view &req, const transaction_handler &h,
                             pg::isolation level) const
{
    call c;
    bool unguarded = false;
    if (auto early = prepare(req, c, unguarded))
        return std::move(*early);
    if (unguarded)
        return unguarded_tx(c, h, level);

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
                // The features are asked before BEGIN: a failed catalog
                // read must not abort the transaction.
                refuse_router(*conn, "in-transaction");
                c.can_wait = cfg_.wakeup() == follower_wakeup::server_wait && !c.wait_refused &&
                             features(*conn).begin_wait;
                c.server_wait = c.can_wait && c.seen_in_progress;
                // BEGIN, the claim and the handler's savepoint go in one
                // flight (libpq's pipeline mode).
                tx.emplace(*conn, level, pg::defer_begin);
                // Duplicates wait inside idem_begin for the first transaction
                // (bounded by our budget as lock_timeout, the caller's setting
                // restored by the same statement), and with max_wait for a
                // lease-mode winner too.
                c.asked = c.server_wait ? wait_for(cfg_, c.deadline, *conn) : milliseconds(0);
                std::vector<pg::param> params{
                    pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(pg::as_bytea(c.rh_bytes)),
                    pg::to_param(lock_timeout_text(remaining(c.deadline)))};
                if (c.server_wait)
                {
                    params.push_back(pg::to_param(c.asked));
                    params.push_back(pg::param::text(wall_clock_in(c.asked), timestamptz_oid));
                }
                c.sent = clock::now();
                std::vector<pg::result> rs = tx->exec_pipeline(
                    {pg::statement{c.server_wait ? sql_.begin_wait : sql_.begin, std::move(params),
                                   pg::format::binary},
                     pg::statement{"SAVEPOINT idem_handler", {}, pg::format::text}},
                    cfg_.prepared_statements());
                row = parse_row(rs.front());
            }
        }
        catch (const pg::lock_not_available &)
        {
            tx.reset();
            if (clock::now() >= c.deadline)
                return timed_out(c);
            continue;
        }
        catch (const pg::query_canceled &)
        {
            // A statement_timeout shorter than our wait in the server: poll.
            tx.reset();
            if (!c.server_wait || clock::now() >= c.deadline)
                return c.server_wait ? timed_out(c) : unavailable(c);
            c.wait_refused = true;
            do_claim = false;
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
        note_server_wait(c, row);

        if (do_claim && row.won())
        {
            report_win(*this, row);
            c.res.generation = row.generation;
            claim_context ctx(row.generation, row.claim_id, c.ck);
            response resp;
            try
            {
                c.res.handler_ran = true;
                resp = h(*tx, ctx);
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
                // The handler threw: keep a cooldown, drop its writes.
                std::exception_ptr err = std::current_exception();
                keep_cooldown(c, tx, row.claim_id);
                finish(c, outcome::failed);
                std::rethrow_exception(err);
            }

            // The handler has returned: an error from here on is the
            // store's. It is answered, not thrown, and never runs the
            // handler again in this call (but for the server's own "retry
            // the transaction", 40001 / 40P01, which rolled everything back).
            const storage_action action = classify(resp.status, cfg_.client_errors());
            try
            {
                const bool over_client_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
                std::optional<std::size_t> server_cap;
                // Unnamed: no statement cache may abort the handler's
                // transaction. A finalize goes with COMMIT, in one flight.
                const bool finalize = action == storage_action::finalize;
                if (action == storage_action::release)
                    qu(*tx, sql_.release,
                       {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(row.claim_id)});
                else if (action == storage_action::fail)
                {
                    // A failure keeps none of the handler's writes but does
                    // keep the cooldown.
                    tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
                    qu(*tx, sql_.fail,
                       {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(row.claim_id),
                        pg::to_param(cfg_.failure_cooldown())});
                }
                try
                {
                    if (finalize)
                    {
                        std::vector<pg::result> rs = tx->commit_with(
                            {pg::statement{sql_.finalize, finalize_params(c, row.claim_id, resp, true),
                                           pg::format::text}},
                            pg::preparation::unnamed);
                        server_cap = parse_size_setting(rs.front().get_optional_text(0, 1));
                    }
                    else
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
                        std::vector<pg::param> params{
                            pg::to_param(pg::as_bytea(c.ck_bytes)),
                            pg::to_param(pg::as_bytea(c.rh_bytes)),
                            pg::to_param(lock_timeout_text(cfg_.follower_wait_budget()))};
                        claim_row seen = parse_row(qu(ptx, sql_.begin, params, pg::format::binary));
                        ptx.rollback();
                        const bool stored = seen.stored();
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
            catch (const std::exception &e)
            {
                const auto *rb = dynamic_cast<const pg::transaction_rollback *>(&e);
                const bool transient = rb && (dynamic_cast<const pg::serialization_failure *>(rb) ||
                                              dynamic_cast<const pg::deadlock_detected *>(rb));
                if (transient && ++attempts < cfg_.transaction_attempts())
                {
                    tx.reset();
                    continue;  // everything rolled back, the claim too
                }
                // Nothing of this request is committed. Keep a cooldown
                // (duplicates waiting in idem_begin are not run at once)
                // and tell the caller that its result was not stored.
                emit(event::finalize_error);
                c.res.error = std::current_exception();
                report(c.res.error, "finalize");
                keep_cooldown(c, tx, row.claim_id);
                if (conn && !conn->is_open())
                    conn.reset();
                c.res.response = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
                return finish(c, outcome::failed);
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

}  // namespace idem::detail
