// libpq's pipeline mode: several statements in one flight (one Sync, one
// round trip), and a transaction whose BEGIN or COMMIT rides with them.
#include <idem/pg.hpp>

#include "pg/wire.hpp"

namespace idem::pg {

using detail::statement_key;
using detail::wire_params;

std::vector<result> connection::send_pipeline(const std::vector<statement> &stmts,
                                              preparation how, bool &lost)
{
    lost = false;
    if (!is_open())
        throw broken_connection("connection is not open: " + error_message());
    if (how == preparation::automatic && !behind_pooler_)
        detect_pooler();
    const bool named = how == preparation::named ||
                       (how == preparation::automatic && !behind_pooler_.value_or(false));
    PGconn *c = conn_.get();
    if (!PQenterPipelineMode(c))
        throw failure("pg: cannot enter pipeline mode: " + error_message());
    struct leave
    {
        PGconn *c;
        ~leave() { PQexitPipelineMode(c); }
    } guard{c};
    // What each result that comes back answers: a Parse (a statement's
    // name to record) or a statement's execution.
    struct pending
    {
        bool parse;
        std::size_t index;
        std::string key, name;
    };
    std::vector<pending> order;
    ++round_trips_;
    for (std::size_t i = 0; i < stmts.size(); ++i)
    {
        const statement &s = stmts[i];
        const wire_params w(s.params);
        const int fmt = static_cast<int>(s.result_format);
        bool ok;
        if (!named)
            ok = PQsendQueryParams(c, s.sql.c_str(), w.count(), w.types.data(), w.values.data(),
                                   w.lengths.data(), w.formats.data(), fmt);
        else
        {
            const std::string key = statement_key(s.sql, s.params);
            auto it = prepared_.find(key);
            std::string name;
            ok = true;
            if (it != prepared_.end())
                name = it->second;
            else
            {
                name = "pg_idem_" + std::to_string(++statements_named_);
                ok = PQsendPrepare(c, name.c_str(), s.sql.c_str(), w.count(), w.types.data());
                order.push_back(pending{true, i, key, name});
            }
            ok = ok && PQsendQueryPrepared(c, name.c_str(), w.count(), w.values.data(),
                                           w.lengths.data(), w.formats.data(), fmt);
        }
        if (!ok)
            throw broken_connection(error_message());
        order.push_back(pending{false, i, {}, {}});
    }
    if (!PQpipelineSync(c))
        throw broken_connection(error_message());
    std::vector<result> out(stmts.size());
    std::size_t at = 0;
    for (;;)
    {
        PGresult *r = PQgetResult(c);
        if (!r)
        {
            if (!is_open())
            {
                lost = true;
                return out;
            }
            continue;  // end of one command's results
        }
        const ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC)
        {
            PQclear(r);
            break;
        }
        if (at >= order.size())
        {
            PQclear(r);
            continue;
        }
        const pending &p = order[at++];
        if (p.parse)
        {
            if (st == PGRES_COMMAND_OK)
            {
                prepared_.emplace(p.key, p.name);
                PQclear(r);
            }
            else
                out[p.index] = result(r);  // its error stands for the statement
        }
        else if (!out[p.index].native_handle())
            out[p.index] = result(r);
        else
            PQclear(r);  // after a failed Parse: its execution was skipped
    }
    return out;
}

std::vector<result> connection::exec_pipeline(const std::vector<statement> &stmts, preparation how)
{
    bool lost = false;
    std::vector<result> out = send_pipeline(stmts, how, lost);
    if (lost)
        throw broken_connection(error_message());
    for (std::size_t i = 0; i < out.size(); ++i)
    {
        try
        {
            out[i] = checked(std::move(out[i]), stmts[i].sql);
        }
        catch (const sql_error &e)
        {
            // A name the session no longer has (DISCARD ALL): parse it again next time.
            if (e.sqlstate() == "26000")
                prepared_.erase(statement_key(stmts[i].sql, stmts[i].params));
            throw;
        }
    }
    return out;
}

namespace {

// The statements of a flight, behind the deferred BEGIN when it is still to send.
std::vector<statement> after_begin(const char *begin_sql, const std::vector<statement> &stmts)
{
    std::vector<statement> all;
    all.reserve(stmts.size() + 2);
    if (begin_sql != nullptr)
        all.push_back(statement{begin_sql, {}, format::text});
    all.insert(all.end(), stmts.begin(), stmts.end());
    return all;
}

}  // namespace

std::vector<result> transaction::exec_pipeline(const std::vector<statement> &stmts, preparation how)
{
    if (!active_)
        throw std::logic_error("transaction: already committed or rolled back");
    const bool with_begin = begin_pending_;
    std::vector<statement> all = after_begin(with_begin ? begin_sql_ : nullptr, stmts);
    begin_pending_ = false;
    std::vector<result> out;
    try
    {
        out = conn_.exec_pipeline(all, how);
    }
    catch (const broken_connection &)
    {
        active_ = false;  // the server rolled it back with the session
        throw;
    }
    catch (...)
    {
        // A BEGIN that failed left no transaction behind.
        if (conn_.status() == transaction_status::idle)
            active_ = false;
        throw;
    }
    if (with_begin)
        out.erase(out.begin());
    return out;
}

std::vector<result> transaction::commit_with(const std::vector<statement> &stmts, preparation how)
{
    if (!active_)
        throw std::logic_error("transaction: already committed or rolled back");
    const bool with_begin = begin_pending_;
    std::vector<statement> all = after_begin(with_begin ? begin_sql_ : nullptr, stmts);
    all.push_back(statement{"COMMIT", {}, format::text});
    begin_pending_ = false;
    bool lost = false;
    std::vector<result> out = conn_.send_pipeline(all, how, lost);
    if (lost)
    {
        active_ = false;
        throw unknown_outcome("connection lost while COMMIT was in flight: " + conn_.error_message());
    }
    // The statements first: one that failed means COMMIT did not run.
    for (std::size_t i = 0; i + 1 < out.size(); ++i)
    {
        try
        {
            out[i] = conn_.checked(std::move(out[i]), all[i].sql);
        }
        catch (const broken_connection &)
        {
            active_ = false;
            throw unknown_outcome("connection lost while COMMIT was in flight: " + conn_.error_message());
        }
        catch (...)
        {
            if (conn_.status() == transaction_status::idle)
                active_ = false;
            throw;
        }
    }
    active_ = false;
    conn_.check_commit(std::move(out.back()));
    out.pop_back();
    if (with_begin)
        out.erase(out.begin());
    return out;
}

transaction::~transaction()
{
    if (!active_)
        return;
    try
    {
        rollback();
    }
    catch (...)
    {
    }
}

}  // namespace idem::pg
