// In-transaction mode: idem_begin, the handler and the finalize in one
// transaction. run_in_tx goes round a loop of parts, each deciding one
// thing: begin_in_tx (the claim and what its errors mean), run_handler_in_tx
// (whether the handler's error is retried, or fails the claim) and
// store_in_tx (how the handler's result is stored with its transaction).
#include "runner/engine.hpp"

namespace idem::detail {

// ---- in-transaction mode --------------------------------------------------------

namespace {

// A 40001 or 40P01: the server rolled the transaction back and asks for a retry.
bool transient(const std::exception &e)
{
    return dynamic_cast<const pg::serialization_failure *>(&e) ||
           dynamic_cast<const pg::deadlock_detected *>(&e);
}

void rollback_quietly(std::optional<pg::transaction> &tx)
{
    if (!tx)
        return;
    try
    {
        tx->rollback();
    }
    catch (...)
    {
    }
    tx.reset();
}

}  // namespace

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

    in_tx_run s;
    for (;;)
    {
        if (++c.iterations > cfg_.max_iterations())
            return timed_out(c);
        std::optional<pg::transaction> tx;
        claim_row row;
        step st = begin_in_tx(c, s, level, tx, row);
        if (st == step::again)
            continue;
        if (st == step::answered)
            return std::move(s.result);
        if (s.do_claim && row.won())
        {
            report_win(*this, row);
            c.res.generation = row.generation;
            response resp;
            st = run_handler_in_tx(c, s, tx, row, h, resp);
            if (st == step::next)
                st = store_in_tx(c, s, tx, row, std::move(resp));
            if (st == step::again)
                continue;
            return std::move(s.result);
        }
        rollback_quietly(tx);
        if (std::optional<run_result> r = follow(c, s.conn, row, s.do_claim))
            return std::move(*r);
    }
}

// BEGIN, the claim and the handler's savepoint in one flight (libpq's
// pipeline mode); a follower's read of the key instead when it polls.
claim_row engine::begin_flight(call &c, in_tx_run &s, pg::isolation level,
                               std::optional<pg::transaction> &tx) const
{
    if (!s.conn)
        s.conn = acquire_round(c);
    if (!s.do_claim)
        return lookup(c, *s.conn);
    // The features are asked before BEGIN: a failed catalog read must not
    // abort the transaction.
    refuse_router(*s.conn, "in-transaction");
    c.can_wait = cfg_.wakeup() == follower_wakeup::server_wait && !c.wait_refused &&
                 features(*s.conn).begin_wait;
    c.server_wait = c.can_wait && c.seen_in_progress;
    tx.emplace(*s.conn, level, pg::defer_begin);
    // Duplicates wait inside idem_begin for the first transaction (bounded
    // by our budget as lock_wait, for idem_begin only), and with max_wait
    // for a lease-mode winner too.
    c.asked = c.server_wait ? wait_for(cfg_, c.deadline, *s.conn, capacity_.has_value()) : milliseconds(0);
    std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                  pg::to_param(pg::as_bytea(c.rh_bytes)),
                                  pg::to_param(lock_wait_text(remaining(c.deadline)))};
    if (c.server_wait)
    {
        params.push_back(pg::to_param(c.asked));
        params.push_back(pg::param::text(wall_clock_in(c.asked), timestamptz_oid));
    }
    c.sent = clock::now();
    const claim_statements &calls_ = calls(*s.conn);
    std::vector<pg::result> rs = tx->exec_pipeline(
        {pg::statement{c.server_wait ? calls_.begin_wait : calls_.begin, std::move(params),
                       pg::format::binary},
         pg::statement{"SAVEPOINT idem_handler", {}, pg::format::text}},
        cfg_.prepared_statements());
    return parse_row(rs.front());
}

// The claim's turn: next with the key's row, again after an error the loop
// outlives (a lock the budget did not cover, a retry the server asked for,
// one lost connection), answered otherwise.
engine::step engine::begin_in_tx(call &c, in_tx_run &s, pg::isolation level,
                                 std::optional<pg::transaction> &tx, claim_row &row) const
{
    try
    {
        row = begin_flight(c, s, level, tx);
    }
    catch (const pg::lock_not_available &)
    {
        tx.reset();
        if (clock::now() < c.deadline)
            return step::again;
        s.result = timed_out(c);
        return step::answered;
    }
    catch (const pg::query_canceled &)
    {
        // A statement_timeout shorter than our wait in the server: poll.
        tx.reset();
        if (c.server_wait && clock::now() < c.deadline)
        {
            c.wait_refused = true;
            s.do_claim = false;
            return step::again;
        }
        s.result = c.server_wait ? timed_out(c) : unavailable(c);
        return step::answered;
    }
    catch (const pg::transaction_rollback &)
    {
        tx.reset();  // e.g. 40001 from idem_begin under REPEATABLE READ
        if (++s.attempts < cfg_.transaction_attempts())
            return step::again;
        s.result = unavailable(c);
        return step::answered;
    }
    catch (const pg::broken_connection &)
    {
        tx.reset();
        s.conn.reset();
        if (++s.broken <= 1)
            return step::again;
        s.result = unavailable(c);
        return step::answered;
    }
    catch (const std::exception &)
    {
        s.result = unavailable(c);
        return step::answered;
    }
    s.broken = 0;
    note_server_wait(c, row);
    return step::next;
}

// The winner's handler in the claim's transaction: next when it returned;
// again when the server rolled everything back (the claim too) and asks for
// a retry, or the session died before COMMIT; its error rethrown otherwise,
// the claim failed with a cooldown when the transaction is still there.
engine::step engine::run_handler_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx,
                                       const claim_row &row, const transaction_handler &h,
                                       response &resp) const
{
    claim_context ctx(row.generation, row.claim_id, c.ck);
    try
    {
        c.res.handler_ran = true;
        resp = h(*tx, ctx);
        return step::next;
    }
    catch (const pg::transaction_rollback &e)
    {
        tx.reset();
        if (transient(e) && ++s.attempts < cfg_.transaction_attempts())
            return step::again;  // everything rolled back, the claim too
        finish(c, outcome::failed);
        throw;
    }
    catch (const pg::broken_connection &)
    {
        // Lost before COMMIT: the claim and the writes died with the session.
        tx.reset();
        s.conn.reset();
        if (++s.attempts < cfg_.transaction_attempts())
            return step::again;
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
}

// The handler's result stored with its transaction, as its status says:
// released, failed (its writes rolled back to the savepoint, the cooldown
// kept) or finalized with COMMIT in one flight. An error from here on is
// the store's: answered, never a reason to run the handler again in this
// call (but for the server's own "retry the transaction", which rolled
// everything back).
engine::step engine::store_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx,
                                 const claim_row &row, response resp) const
{
    const storage_action action = classify(resp.status, cfg_.client_errors());
    try
    {
        // Unnamed: no statement cache may abort the handler's transaction.
        if (action == storage_action::release)
            qu(*tx, sql_.release, {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(row.claim_id)});
        else if (action == storage_action::fail)
        {
            tx->exec("ROLLBACK TO SAVEPOINT idem_handler");
            qu(*tx, sql_.fail,
               {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(row.claim_id),
                pg::to_param(cfg_.failure_cooldown())});
        }
        std::optional<std::size_t> server_cap;
        if (!commit_in_tx(c, s, tx, row, resp, action, server_cap))
            return step::answered;
        c.res.response = std::move(resp);
        if (action != storage_action::finalize)
        {
            s.result = finish(c, action == storage_action::fail ? outcome::failed : outcome::won_completed);
            return step::answered;
        }
        emit(event::finalized);
        const std::size_t size = c.res.response.body.size();
        const bool uncached =
            size > cfg_.max_cacheable_response_bytes() || (server_cap && size > *server_cap);
        s.result = finish(c, uncached ? outcome::completed_uncacheable : outcome::won_completed);
        return step::answered;
    }
    catch (const std::exception &e)
    {
        if (transient(e) && ++s.attempts < cfg_.transaction_attempts())
        {
            tx.reset();
            return step::again;  // everything rolled back, the claim too
        }
        // Nothing of this request is committed. Keep a cooldown (duplicates
        // waiting in idem_begin are not run at once) and tell the caller
        // that its result was not stored.
        emit(event::finalize_error);
        c.res.error = std::current_exception();
        report(c.res.error, "finalize");
        keep_cooldown(c, tx, row.claim_id);
        if (s.conn && !s.conn->is_open())
            s.conn.reset();
        s.result = answer(c, problems::outcome_unknown(cfg_.profile(), cfg_.retry_after()), outcome::failed);
        return step::answered;
    }
}

// COMMIT (with the finalize in its flight): true when the result may be
// answered; false when the caller was answered instead, because the
// commit's outcome was lost with the connection and reading the key showed
// the result not stored, or could not be read.
bool engine::commit_in_tx(call &c, in_tx_run &s, std::optional<pg::transaction> &tx,
                          const claim_row &row, const response &resp, storage_action action,
                          std::optional<std::size_t> &server_cap) const
{
    try
    {
        if (action != storage_action::finalize)
        {
            tx->commit();
            return true;
        }
        std::vector<pg::result> rs = tx->commit_with(
            {pg::statement{sql_.finalize, finalize_params(c, row.claim_id, resp, true), pg::format::text}},
            pg::preparation::unnamed);
        server_cap = parse_size_setting(rs.front().get_optional_text(0, 1));
        return true;
    }
    catch (const pg::unknown_outcome &)
    {
        emit(event::unknown_outcome);
    }
    // Run idem_begin again and roll it back: it waits for a commit still in
    // flight, then says what is stored.
    try
    {
        connection_handle probe = provider_.acquire();
        pg::transaction ptx(*probe);
        std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                      pg::to_param(pg::as_bytea(c.rh_bytes)),
                                      pg::to_param(lock_wait_text(cfg_.follower_wait_budget()))};
        claim_row seen = parse_row(qu(ptx, calls(*probe).begin, params, pg::format::binary));
        ptx.rollback();
        if (seen.stored() || action != storage_action::finalize)
            return true;
        // Not committed: nothing happened. Ask for a retry.
    }
    catch (const std::exception &)
    {
        c.res.outcome_unknown = true;
        c.res.error = std::current_exception();
    }
    s.result = answer(c, problems::outcome_unknown(cfg_.profile(), cfg_.retry_after()), outcome::failed);
    return false;
}

}  // namespace idem::detail
