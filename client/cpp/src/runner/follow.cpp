// Shared pieces of the engine, the claim, the follower wait and the claim
// loop every mode goes round.
#include "runner/engine.hpp"

#include <cstdio>

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
    const std::exception_ptr now = std::current_exception();
    try
    {
        if (now)
            std::rethrow_exception(now);
    }
    catch (const pool_exhausted &)
    {
        // No connection came free (protocol.toml [client.pool]): for a
        // duplicate, whose wait for one is bounded by its budget, the
        // budget's answer (the key is still in progress, as far as it
        // knows); for any other request, connection-pool-exhausted.
        if (c.seen_in_progress)
            return timed_out(c);
        if (!c.res.error)
            c.res.error = now;
        emit(event::pool_exhausted);
        report(now, "connection pool");
        return answer(c, problems::make(protocol::pool_exhausted_answer, cfg_.profile(), cfg_.retry_after()),
                      protocol::pool_exhausted_result);
    }
    catch (...)
    {
    }
    if (!c.res.error)
        c.res.error = now;
    report(c.res.error, "claim");
    return answer(c, problems::store_unavailable(cfg_.profile(), cfg_.retry_after()),
                  outcome::failed);
}

// The wait budget is over: what the protocol answers for in_progress.
run_result engine::timed_out(call &c) const
{
    return answer(c,
                  *problems::for_outcome(protocol::server_outcome::in_progress, cfg_.profile(),
                                         cfg_.retry_after()),
                  protocol::info(protocol::server_outcome::in_progress).result);
}

void engine::note_server_wait(call &c, const claim_row &row) const
{
    // The server does not say whether it waited; a claim with max_wait that
    // did not win and took this long did (an uncontended one takes well
    // under a millisecond). A follower that waited and then won the key (the
    // winner released it) is not counted.
    if (c.server_wait && c.asked.count() > 0 && !row.won() &&
        clock::now() - c.sent >= milliseconds(5))
        start_waiting(c);
}

void engine::start_waiting(call &c) const
{
    if (!c.wait_reported)
    {
        c.wait_reported = true;
        emit(event::pending_wait);
    }
}

connection_handle engine::acquire_round(call &c) const
{
    if (!c.seen_in_progress)
        return provider_.acquire();
    const milliseconds left = remaining(c.deadline);
    if (slots_ && !c.duplicate.slot)
    {
        if (!slots_->take(left))
            throw pool_exhausted("pg_idem: no place among the waiting duplicates' share of the pool came "
                                 "free within the wait budget");
        c.duplicate.slot = &*slots_;
    }
    return provider_.acquire_within(left);
}

void engine::warn_principal() const
{
    if (warned_principal_.exchange(true) || !cfg_.log_errors())
        return;
    std::fputs("pg_idem: a request with an Idempotency-Key has no principal: it is answered 401 "
               "principal-missing, not run. If it was authenticated, the principal is read before "
               "the authentication sets it; a route without users names its callers as one "
               "principal (a fixed string). (Logged once.)\n",
               stderr);
}

std::optional<run_result> engine::prepare(const request_view &req, call &c, bool &unguarded) const
{
    unguarded = false;
    const key_status ks = check_key_header(req.idempotency_keys);
    if ((ks != key_status::absent || req.key_required) && req.principal.empty())
    {
        // protocol.toml [client.missing_principal]: refused, never keyed on
        // "" (one caller's replay to another) nor run unguarded (twice).
        warn_principal();
        return answer(c, problems::make(protocol::missing_principal, cfg_.profile()),
                      protocol::missing_principal_result);
    }
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
    // The namespace goes where the protocol says (the same key in every client).
    c.ck = cache_key(req.principal, req.method,
                     protocol::namespaced_target(cfg_.key_namespace(), req.target),
                     req.idempotency_keys.front());
    c.ck_bytes = to_bytes(c.ck);
    c.rh_bytes = to_bytes(request_hash(req.body));
    c.deadline = clock::now() + cfg_.follower_wait_budget();
    c.backoff = cfg_.poll_min();
    return std::nullopt;
}

claim_row engine::claim(call &c, pg::connection &conn) const
{
    if (c.one_transaction)
        refuse_router(conn, c.one_transaction);
    c.can_wait = cfg_.wakeup() == follower_wakeup::server_wait && !c.wait_refused &&
                 features(conn).claim_wait;
    c.server_wait = c.can_wait && c.seen_in_progress;
    c.asked = c.server_wait ? wait_for(cfg_, c.deadline, conn, capacity_.has_value()) : milliseconds(0);
    std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                  pg::to_param(pg::as_bytea(c.rh_bytes)),
                                  pg::to_param(cfg_.lease()),
                                  pg::to_param(lock_wait_text(remaining(c.deadline)))};
    if (c.server_wait)
    {
        params.push_back(pg::to_param(c.asked));
        params.push_back(pg::param::text(wall_clock_in(c.asked), timestamptz_oid));
    }
    c.sent = clock::now();
    return parse_row(qp(conn, c.server_wait ? calls(conn).claim_wait : calls(conn).claim, params,
                        pg::format::binary));
}

claim_row engine::lookup(call &c, pg::connection &conn) const
{
    std::vector<pg::param> params{pg::to_param(pg::as_bytea(c.ck_bytes)),
                                  pg::to_param(pg::as_bytea(c.rh_bytes))};
    c.asked = milliseconds(0);
    c.sent = clock::now();
    return parse_row(qp(conn, sql_.lookup, params, pg::format::binary));
}

// What a non-winning row means for this request: the protocol's action
// for its outcome (protocol.toml's client column), with the protocol's
// problem and run result.
engine::next engine::on_row(call &c, const claim_row &row) const
{
    if (row.kind == protocol::server_outcome::unknown)
        throw pg::failure("pg_idem: unexpected claim outcome '" + row.outcome +
                          "' (a newer server than this client knows)");
    const protocol::outcome_info &info = protocol::info(row.kind);
    switch (info.what)
    {
    case protocol::action::replay:
    {
        response r;
        r.status = row.status.value_or(200);
        if (row.headers_json)
            r.headers = headers_from_json(*row.headers_json);
        r.headers.push_back({replay_header_name, "true"});
        r.body = row.body.value_or("");
        c.res.response = std::move(r);
        c.res.replayed = true;
        c.res.outcome = info.result;
        return next::answer;
    }
    case protocol::action::answer:
        if (row.kind == protocol::server_outcome::cooldown)
            emit(event::retryable_cooldown);
        // The server's hint where it gives one (what is left of a cooldown).
        c.res.response = *problems::for_outcome(row.kind, cfg_.profile(),
                                                row.retry_after.value_or(cfg_.retry_after()));
        c.res.outcome = info.result;
        return next::answer;
    case protocol::action::wait:
        return next::wait;
    case protocol::action::claim:
        return next::claim;
    case protocol::action::run:
        break;
    }
    throw pg::failure("pg_idem: claim outcome '" + row.outcome + "' where none was claimed");
}

void engine::wait_for_winner(call &c, pg::connection &, const claim_row &row) const
{
    start_waiting(c);
    if (c.can_wait && !c.server_wait)
        return;  // first sight of in_progress: the next claim waits in the server
    if (c.server_wait)
    {
        // The server waited for us. Go straight back unless it answered
        // well before max_wait (a server capping it lower, idem.max_wait,
        // or not preloaded): then nap first, as when polling.
        const auto waited = std::chrono::duration_cast<milliseconds>(clock::now() - c.sent);
        if (c.asked.count() > 0 && waited >= c.asked * 9 / 10)
        {
            // A full wait cannot spin: it does not count against
            // max_iterations (slices of a long budget would).
            --c.iterations;
            return;
        }
    }
    milliseconds nap = jittered(c.backoff, cfg_.poll_jitter());
    if (row.retry_after)
        nap = std::min(nap, *row.retry_after + milliseconds(1));
    c.backoff = std::min(c.backoff * 2, cfg_.poll_max());
    // To the deadline exactly, not to its whole milliseconds: a nap cut to
    // 0 ms would go round without sleeping in the budget's last one.
    std::this_thread::sleep_until(std::min(clock::now() + nap, c.deadline));
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
                conn = acquire_round(c);
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
        catch (const pg::query_canceled &)
        {
            // A statement_timeout shorter than our wait in the server: wait
            // again (bounded by the budget and max_iterations), in naps.
            if (!c.server_wait || clock::now() >= c.deadline)
                return c.server_wait ? timed_out(c) : unavailable(c);
            c.wait_refused = true;
            do_claim = false;
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
        note_server_wait(c, row);
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
        c.seen_in_progress = true;
        if (!c.duplicate.waiting)
        {
            c.duplicate.waiting = &duplicates_waiting_;
            ++duplicates_waiting_;
        }
        start_waiting(c);
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
        if (capacity_)
        {
            // A bounded provider: the connection and the slot go back between
            // rounds, for the requests that would run (issue 31).
            conn.reset();
            c.duplicate.give_slot();
        }
        // Waiting in the server: ask it again (the claim waits); polling:
        // read the key, claim it once it is free.
        do_claim = c.can_wait;
        return std::nullopt;
    }
    return std::nullopt;
}

}  // namespace idem::detail
