// Fenced mode: the claim commits first, the handler's transaction ends with
// a fenced idem_finalize.
#include "runner/engine.hpp"

namespace idem::detail {

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

    // What is left to do with the claim once the handler transaction is over.
    enum class after
    {
        done,     // stored with the transaction
        give_up,  // release or fail it
        follow,   // lost it (IL001): answer from the key like a follower
        pending   // the handler ran, its result is not stored: leave the key to its lease
    } todo = after::give_up;
    storage_action action = storage_action::fail;
    outcome result = outcome::failed;
    response resp;
    std::exception_ptr rethrow;

    for (unsigned attempt = 1;; ++attempt)
    {
        connection_handle tx_conn;
        std::optional<pg::transaction> tx;  // destroyed (rolled back) before its connection
        try
        {
            tx_conn = provider_.acquire();
            tx.emplace(*tx_conn, level);
            c.res.handler_ran = true;
            resp = h(*tx, ctx);
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

        // The handler has returned: from here on an error is the store's,
        // never a reason to free the key (a duplicate would run the handler
        // again), except the server's own "retry the transaction".
        try
        {
            action = classify(resp.status, cfg_.client_errors());
            if (action == storage_action::fail)
            {
                try
                {
                    tx->rollback();  // a failure leaves none of its writes behind
                }
                catch (const std::exception &)
                {
                    // the connection is gone, and the transaction with it
                }
                result = outcome::failed;
                break;
            }
            if (action == storage_action::release)
            {
                try
                {
                    tx->commit();
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
            // if the claim is no longer ours, taking the handler's writes
            // down. Unnamed, so that no statement cache can make it fail.
            pg::result r = qu(*tx, sql_.finalize, finalize_params(c, row.claim_id, resp, true));
            const auto server_cap = parse_size_setting(r.get_optional_text(0, 1));
            std::optional<settled> s;
            try
            {
                tx->commit();
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
            else if (*s == settled::lost)
                todo = after::follow;
            else
                todo = after::pending;  // not committed, or not known
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
                continue;  // rolled back by the server, claim still ours: run it again
            emit(event::finalize_error);
            c.res.error = std::current_exception();
            report(c.res.error, "finalize");
            todo = after::pending;
            break;
        }
        catch (const std::exception &)
        {
            // The finalize or the COMMIT refused, or the connection lost
            // before COMMIT: the handler's writes are gone with the
            // transaction, and running it again here would run it twice.
            emit(event::finalize_error);
            c.res.error = std::current_exception();
            report(c.res.error, "finalize");
            todo = after::pending;
            break;
        }
    }

    if (todo == after::pending)
    {
        // Nothing of this run is stored and the key stays ours until its
        // lease runs out; the caller's retry with the same key is answered
        // from it then (or recovers it and runs once).
        c.res.outcome_unknown = true;
        resp = problems::outcome_unknown(cfg_.profile(), cfg_.retry_after());
        result = outcome::failed;
    }
    keeper.stop();
    connection_handle cn = keeper.take_connection();
    if (todo == after::give_up)
        give_up_claim(c, cn, row.claim_id, action);
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

}  // namespace idem::detail
