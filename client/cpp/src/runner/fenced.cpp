// Fenced mode: the claim commits first, the handler's transaction ends with
// a fenced idem_finalize. win_fenced runs the handler's transaction in
// tries, each in parts that decide one thing: run_handler_fenced (whether
// the handler's error is retried or fails the claim), store_fenced (how its
// result is stored with its transaction) and commit_fenced (the fence and
// COMMIT, settled by reading when the commit's outcome was lost); then
// conclude_fenced does what is left with the claim.
#include "runner/engine.hpp"

namespace idem::detail {

namespace {

// A 40001 or 40P01: the server rolled the transaction back and asks for a retry.
bool transient(const std::exception &e)
{
    return dynamic_cast<const pg::serialization_failure *>(&e) ||
           dynamic_cast<const pg::deadlock_detected *>(&e);
}

}  // namespace

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
    c.one_transaction = "fenced";
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
    lease_keeper keeper(*this, c, row.claim_id, std::move(conn));
    claim_context ctx(row.generation, row.claim_id, c.ck, keeper.lost_flag());
    keeper.start();

    fenced_run run;
    for (unsigned attempt = 1;; ++attempt)
    {
        connection_handle tx_conn;
        std::optional<pg::transaction> tx;  // destroyed (rolled back) before its connection
        step st = run_handler_fenced(c, ctx, h, level, attempt, tx_conn, tx, run);
        if (st == step::next)
            st = store_fenced(c, row, *tx, attempt, run);
        if (st != step::again)
            break;
    }
    return conclude_fenced(c, keeper, row, run, h, level);
}

// The handler in a transaction of its own: next when it returned; again
// when the server asked for a retry or the session died before COMMIT (the
// transaction died with it, so running it again cannot do it twice);
// answered when it threw, which fails the claim and is rethrown.
engine::step engine::run_handler_fenced(call &c, claim_context &ctx, const transaction_handler &h,
                                        pg::isolation level, unsigned attempt,
                                        connection_handle &tx_conn,
                                        std::optional<pg::transaction> &tx, fenced_run &run) const
{
    try
    {
        tx_conn = provider_.acquire();
        tx.emplace(*tx_conn, level);
        c.res.handler_ran = true;
        run.resp = h(*tx, ctx);
        return step::next;
    }
    catch (const pg::transaction_rollback &e)
    {
        if (transient(e) && attempt < cfg_.transaction_attempts())
            return step::again;  // rolled back, claim still ours: run it again
        run.rethrow = std::current_exception();
    }
    catch (const pg::broken_connection &)
    {
        if (attempt < cfg_.transaction_attempts())
            return step::again;
        run.rethrow = std::current_exception();
    }
    catch (...)
    {
        run.rethrow = std::current_exception();
    }
    run.action = storage_action::fail;
    return step::answered;
}

// The handler's result with its transaction, as its status says: a
// failure rolls its writes back, a release commits them, a finalize is the
// fence. From here on an error is the store's, never a reason to free the
// key (a duplicate would run the handler again), except the server's own
// "retry the transaction".
engine::step engine::store_fenced(call &c, const claim_row &row, pg::transaction &tx,
                                  unsigned attempt, fenced_run &run) const
{
    try
    {
        run.action = classify(run.resp.status, cfg_.client_errors());
        if (run.action == storage_action::fail)
        {
            try
            {
                tx.rollback();  // a failure leaves none of its writes behind
            }
            catch (const std::exception &)
            {
                // the connection is gone, and the transaction with it
            }
            run.result = outcome::failed;
            return step::answered;
        }
        if (run.action == storage_action::release)
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
            run.result = outcome::won_completed;
            return step::answered;
        }
        commit_fenced(c, row, tx, run);
        return step::answered;
    }
    catch (const pg::lease_lost &)
    {
        emit(event::lease_stolen);
        c.res.lease_stolen = true;
        run.todo = fenced_after::follow;
        return step::answered;
    }
    catch (const std::exception &e)
    {
        if (dynamic_cast<const pg::transaction_rollback *>(&e) && transient(e) &&
            attempt < cfg_.transaction_attempts())
            return step::again;  // rolled back by the server, claim still ours: run it again
        // The finalize or the COMMIT refused, or the connection lost before
        // COMMIT: the handler's writes are gone with the transaction, and
        // running it again here would run it twice.
        emit(event::finalize_error);
        c.res.error = std::current_exception();
        report(c.res.error, "finalize");
        run.todo = fenced_after::pending;
        return step::answered;
    }
}

// The fence and COMMIT: the finalize raises IL001 (lease_lost) if the
// claim is no longer ours, taking the handler's writes down. Unnamed, so
// that no statement cache can make it fail. A commit whose outcome was lost
// with the connection is settled by reading the key.
void engine::commit_fenced(call &c, const claim_row &row, pg::transaction &tx, fenced_run &run) const
{
    const bool over_client_cap = run.resp.body.size() > cfg_.max_cacheable_response_bytes();
    pg::result r = qu(tx, sql_.finalize, finalize_params(c, row.claim_id, run.resp, true));
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
        const bool uncached = over_client_cap || (server_cap && run.resp.body.size() > *server_cap) ||
                              (s && *s == settled::committed_uncached);
        run.result = uncached ? outcome::completed_uncacheable : outcome::won_completed;
        run.todo = fenced_after::done;
    }
    else if (*s == settled::lost)
        run.todo = fenced_after::follow;
    else
        run.todo = fenced_after::pending;  // not committed, or not known
}

// What is left once the handler's transaction is over: give the claim up
// (release or fail), rethrow the handler's error, follow the key like a
// follower when the claim was lost, or answer; a result that was not
// stored leaves the key pending to its lease and is answered "outcome
// unknown".
run_result engine::conclude_fenced(call &c, lease_keeper &keeper, claim_row &row, fenced_run &run,
                                   const transaction_handler &h, pg::isolation level) const
{
    if (run.todo == fenced_after::pending)
    {
        // The caller's retry with the same key is answered from the key once
        // its lease runs out (or recovers it and runs once).
        c.res.outcome_unknown = true;
        run.resp = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
        run.result = outcome::failed;
    }
    keeper.stop();
    connection_handle cn = keeper.take_connection();
    if (run.todo == fenced_after::give_up)
        give_up_claim(c, cn, row.claim_id, run.action);
    if (run.rethrow)
    {
        finish(c, outcome::failed);
        std::rethrow_exception(run.rethrow);
    }
    if (run.todo == fenced_after::follow)
    {
        c.deadline = clock::now() + cfg_.follower_wait_budget();
        return loop(c, std::move(cn), false, [&](call &cc, connection_handle cn2, claim_row &row2) {
            return win_fenced(cc, std::move(cn2), row2, h, level);
        });
    }
    c.res.response = std::move(run.resp);
    return finish(c, run.result);
}

}  // namespace idem::detail
