// Shared pieces of the engine, the claim, the follower wait and the claim
// loop every mode goes round.
#include "runner_engine.hpp"

namespace idem::detail {

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
    return parse_row(qp(conn, sql_.claim, params, pg::format::binary));
}

claim_row engine::lookup(call &c, pg::connection &conn) const
{
    const bool use_lock = cfg_.wakeup() == follower_wakeup::advisory_lock;
    std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                  pg::to_param(pg::as_bytea(c.rh_bytes)), pg::to_param(use_lock),
                                  pg::to_param(lock_class), pg::to_param(c.lock_key)};
    return parse_row(qp(conn, sql_.lookup, params, pg::format::binary));
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
                q(conn, wait_sql, lock_timeout_text(slice), lock_class, c.lock_key);
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
        q(*conn, unlock_sql, lock_class, c.lock_key);
    }
    catch (...)
    {
        // Never hand a connection back to the pool still holding our lock.
        conn->close();
    }
}

}  // namespace idem::detail
