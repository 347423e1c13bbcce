// Giving a claim up (release, fail) and settling a commit whose outcome
// was lost with the connection.
#include "runner/engine.hpp"

namespace idem::detail {

void engine::give_up_claim(call &c, connection_handle &conn, const std::string &claim_id,
                           storage_action action) const
{
    try
    {
        if (!conn)
            conn = provider_.acquire();
        pg::result r = action == storage_action::fail
                           ? q(*conn, sql_.fail, pg::as_bytea(c.ck_bytes), claim_id,
                               cfg_.failure_cooldown())
                           : q(*conn, sql_.release, pg::as_bytea(c.ck_bytes), claim_id);
        if (r.is_null(0, 0) || !r.get_bool(0, 0))
        {
            emit(event::lease_stolen);
            c.res.lease_stolen = true;
        }
    }
    catch (const std::exception &)
    {
        emit(event::release_error);
        if (!c.res.error)
            c.res.error = std::current_exception();
        if (conn && !conn->is_open())
            conn.reset();
    }
}

bool is_prepared_statement_error(const std::exception &e)
{
    const auto *s = dynamic_cast<const pg::sql_error *>(&e);
    return s && (s->sqlstate() == "26000" || s->sqlstate() == "42P05");
}

// After a lost connection or a refused finalize: did our commit happen?
// Renewing the claim waits for a commit still in flight (it holds the row
// lock) and then tells whether the key is still ours (nothing was stored;
// the renewal also gives it a full lease); otherwise the stored row says
// whether it holds our result. Unnamed statements: a statement cache the
// server session does not share may be what failed.
settled engine::settle_by_reading(call &c, const std::string &claim_id,
                                  std::int64_t generation) const
{
    const auto deadline = clock::now() + cfg_.follower_wait_budget();
    for (unsigned attempt = 0; attempt < 3 && clock::now() < deadline; ++attempt)
    {
        try
        {
            connection_handle conn = provider_.acquire();
            pg::result r = qu(*conn, calls(*conn).renew,
                              {pg::to_param(pg::as_bytea(c.ck_bytes)), pg::to_param(claim_id),
                               pg::to_param(cfg_.lease()),
                               pg::to_param(lock_wait_text(remaining(deadline)))});
            if (!r.is_null(0, 0) && r.get_bool(0, 0))
                return settled::not_committed;
            const claim_row row = parse_row(qu(*conn, sql_.lookup,
                                               {pg::to_param(pg::as_bytea(c.ck_bytes)),
                                                pg::to_param(pg::as_bytea(c.rh_bytes))},
                                               pg::format::binary));
            const bool ours = row.generation == 0 || generation == 0 || row.generation == generation;
            if (row.kind == protocol::server_outcome::replay && ours)
                return settled::committed;
            if (row.kind == protocol::server_outcome::not_replayable && ours)
                return settled::committed_uncached;
            return settled::lost;
        }
        catch (const pg::lock_not_available &)
        {
            return settled::unknown;
        }
        catch (const pg::query_canceled &)
        {
            return settled::unknown;
        }
        catch (const std::exception &)
        {
            if (!c.res.error)
                c.res.error = std::current_exception();
            std::this_thread::sleep_for(cfg_.poll_min());
        }
    }
    return settled::unknown;
}

std::vector<pg::param> engine::finalize_params(const call &c, const std::string &claim_id,
                                               const response &resp, bool strict) const
{
    const bool over_cap = resp.body.size() > cfg_.max_cacheable_response_bytes();
    // Over the client's cap one byte is enough for the server to record
    // "completed, not replayable" (see statements::finalize).
    const std::string_view body =
        over_cap ? std::string_view(resp.body).substr(0, 1) : std::string_view(resp.body);
    return {pg::to_param(pg::as_bytea(c.ck_bytes)),
            pg::to_param(claim_id),
            pg::to_param(resp.status),
            pg::to_param(allow_.to_json(resp.headers)),
            pg::to_param(pg::as_bytea(body)),
            pg::to_param(strict),
            pg::to_param(over_cap)};
}

}  // namespace idem::detail
