// Multi-step attempts from the service's side, and the reconciler.
//
// Every transition the reconciler makes is one of the server's status +
// generation compare-and-swaps on a row it holds locked (the batch
// functions lock with FOR UPDATE SKIP LOCKED until the pass's transaction
// ends), so two reconcilers never handle one attempt at once, and a client
// finishing its own attempt meanwhile waits for the lock and then finds
// the attempt moved on (false: stale). Each attempt runs in a savepoint:
// a finalizer that throws, a store that cannot be read, or a promotion that
// turns out stale rolls back that attempt's writes only.
#include <idem/reconciler.hpp>

#include "messaging/detail.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

namespace idem {

namespace {

using std::chrono::milliseconds;

constexpr std::size_t key_prefix_max_bytes = 255;
constexpr std::size_t target_max_bytes = 512;
constexpr std::size_t safe_name_max_bytes = 100;
constexpr std::size_t safe_ext_max_bytes = 16;

// Bytes kept as they are in names and path segments (the server's safe_byte).
bool safe_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_';
}

// The server's check_path: segments of [A-Za-z0-9._-] joined by '/'.
void check_path(const char *what, std::string_view path, std::size_t max_bytes)
{
    if (path.empty())
        throw std::invalid_argument(std::string(what) + " must not be empty");
    if (path.size() > max_bytes)
        throw std::invalid_argument(std::string(what) + " must be at most " +
                                    std::to_string(max_bytes) + " bytes");
    std::size_t start = 0;
    for (std::size_t i = 0; i <= path.size(); ++i)
    {
        if (i == path.size() || path[i] == '/')
        {
            std::string_view seg = path.substr(start, i - start);
            if (seg.empty() || seg == "." || seg == "..")
                throw std::invalid_argument("invalid " + std::string(what) + " \"" +
                                            std::string(path) +
                                            "\": a path segment is empty, \".\" or \"..\"");
            start = i + 1;
        }
        else if (!safe_byte(static_cast<unsigned char>(path[i])))
            throw std::invalid_argument("invalid " + std::string(what) + " \"" + std::string(path) +
                                        "\": use letters, digits, '.', '-', '_' and '/'");
    }
}

// Byte length of the UTF-8 character starting with c (PostgreSQL's pg_utf_mblen).
std::size_t utf8_length(unsigned char c)
{
    if ((c & 0x80) == 0)
        return 1;
    if ((c & 0xe0) == 0xc0)
        return 2;
    if ((c & 0xf0) == 0xe0)
        return 3;
    if ((c & 0xf8) == 0xf0)
        return 4;
    return 1;
}

// A bytea digest column; the server only stores 32-byte ones.
std::optional<digest> digest_from(const pg::result &r, std::size_t row, int col)
{
    if (r.is_null(row, col))
        return std::nullopt;
    const std::string bytes = r.get_bytea(row, col);
    if (bytes.size() != 32)
        throw pg::failure("pg_idem returned a digest that is not 32 bytes");
    digest d{};
    std::memcpy(d.data(), bytes.data(), d.size());
    return d;
}

// An optional digest as a bytea parameter (typed, so NULL is bytea too).
pg::param digest_param(const std::optional<digest> &d)
{
    return d ? pg::to_param(pg::as_bytea(to_bytes(*d))) : pg::param::null(pg::bytea_oid);
}

// The statements, qualified with the configured schema.
struct attempt_sql
{
    std::string open, store, promote, fail, reconcile, sweep, swept, prune;

    explicit attempt_sql(const std::string &schema)
    {
        auto q = [&](const char *name) { return detail::qualified(schema, name); };
        open = "SELECT decision, attempt_id::text, generation, status, failure_reason, next_step,"
               " object_key, declared_digest, current_attempt_id::text, created_at::text FROM " +
               q("idem_attempt_open") + "($1, $2, $3, $4, $5::jsonb, $6, $7::bytea)";
        store = "SELECT " + q("idem_attempt_store") + "($1::uuid, $2, $3)";
        promote = "SELECT " + q("idem_attempt_promote") + "($1::uuid, $2, $3, $4, $5::jsonb)";
        fail = "SELECT " + q("idem_attempt_fail") + "($1::uuid, $2, $3)";
        reconcile = "SELECT attempt_id::text, generation, status, kind, mode, target, object_key,"
                    " declared_digest FROM " +
                    q("idem_attempt_reconcile_batch") + "($1, $2)";
        sweep = "SELECT attempt_id::text, generation, object_key FROM " +
                q("idem_attempt_sweep_batch") + "($1, $2)";
        swept = "SELECT " + q("idem_attempt_swept") + "($1::uuid, $2)";
        prune = "SELECT " + q("idem_attempt_prune") + "($1, $2)";
    }
};

// The boolean answer of a CAS function: false means stale.
bool call_bool(pg::transaction &tx, const std::string &sql, const std::vector<pg::param> &params)
{
    return tx.exec_params(sql, params).get_bool(0, 0);
}

// idem_attempt_promote with the finalizer's event; false when stale.
bool promote(pg::transaction &tx, const attempt_sql &sql, const attempt_ref &a, const digest &d,
             const finalizer &finalize)
{
    promotion_event ev = finalize ? finalize(tx, a) : promotion_event{};
    return call_bool(tx, sql.promote,
                     {pg::to_param(a.attempt_id), pg::to_param(a.generation),
                      pg::to_param(pg::as_bytea(to_bytes(d))), pg::to_param(ev.topic),
                      pg::to_param(ev.payload_json)});
}

// idem_attempt_fail with its failure event; false when stale.
bool fail(pg::transaction &tx, const attempt_sql &sql, const attempt_ref &a, std::string_view reason)
{
    return call_bool(tx, sql.fail,
                     {pg::to_param(a.attempt_id), pg::to_param(a.generation), pg::to_param(std::string(reason))});
}

// idem_attempt_store with the digest read back from the blob; false when stale.
bool store(pg::transaction &tx, const attempt_sql &sql, const attempt_ref &a, const digest &d)
{
    return call_bool(tx, sql.store,
                     {pg::to_param(a.attempt_id), pg::to_param(a.generation),
                      pg::to_param(pg::as_bytea(to_bytes(d)))});
}

}  // namespace

// ---- the service's side -----------------------------------------------------

attempt_ref attempt_decision::attempt(const attempt_request &req) const
{
    if (!attempt_id || !object_key || !status || (*status != protocol::attempt::pending && *status != protocol::attempt::stored))
        throw std::logic_error("attempt_decision::attempt: decision \"" + decision +
                               "\" names no pending or stored attempt");
    attempt_ref a;
    a.attempt_id = *attempt_id;
    a.generation = generation;
    a.status = *status;
    a.kind = req.kind;
    a.target = req.target;
    a.object_key = *object_key;
    a.declared_digest = declared_digest;
    return a;
}

attempt_decision open_attempt(pg::connection &c, const attempt_request &req, const std::string &schema)
{
    detail::check_schema(schema, "open_attempt");
    const attempt_sql sql(schema);
    pg::result r = c.exec_params(
        sql.open, {pg::to_param(req.kind), pg::to_param(req.target), pg::to_param(req.client_request_id),
                   pg::to_param(req.created_by), pg::to_param(req.intent_json),
                   pg::to_param(req.object_name), digest_param(req.declared_digest)});
    attempt_decision d;
    d.decision = r.get_text(0, 0);
    d.attempt_id = r.get_optional_text(0, 1);
    d.generation = r.get_optional_int(0, 2).value_or(0);
    d.status = r.get_optional_text(0, 3);
    d.failure_reason = r.get_optional_text(0, 4);
    d.next_step = r.get_optional_text(0, 5);
    d.object_key = r.get_optional_text(0, 6);
    d.declared_digest = digest_from(r, 0, 7);
    d.current_attempt_id = r.get_optional_text(0, 8);
    d.created_at = r.get_optional_text(0, 9);
    return d;
}

std::string safe_object_name(std::string_view name)
{
    if (name.empty())
        throw std::invalid_argument("object name must not be empty");
    std::size_t start = 0;
    for (std::size_t i = 0; i < name.size(); ++i)
        if (name[i] == '/' || name[i] == '\\')
            start = i + 1;

    std::string buf;
    for (std::size_t i = start; i < name.size();)
    {
        const auto c = static_cast<unsigned char>(name[i]);
        const std::size_t clen = utf8_length(c);
        if (clen == 1 && safe_byte(c) && c != '_')
            buf.push_back(static_cast<char>(c));
        else if (buf.empty() || buf.back() != '_')
            buf.push_back('_');
        i += std::min(clen, name.size() - i);
    }

    // No hidden files, no "..": leading dots go first.
    std::size_t from = buf.find_first_not_of('.');
    std::string kept = from == std::string::npos ? std::string() : buf.substr(from);

    // Cut a long name in its stem, keeping a short extension.
    if (kept.size() > safe_name_max_bytes)
    {
        const std::size_t dot = kept.rfind('.');
        std::size_t ext_len = 0;
        if (dot != std::string::npos && dot != 0 && kept.size() - dot <= safe_ext_max_bytes)
            ext_len = kept.size() - dot;
        kept = kept.substr(0, safe_name_max_bytes - ext_len) + kept.substr(kept.size() - ext_len);
    }

    // No trailing dot (last, so that sanitizing again changes nothing).
    while (!kept.empty() && kept.back() == '.')
        kept.pop_back();
    if (kept.empty())
        throw std::invalid_argument("object name \"" + std::string(name) + "\" has no usable characters");
    return kept;
}

std::string object_key(std::string_view key_prefix, std::string_view target,
                       std::string_view attempt_id, std::int64_t generation,
                       std::string_view object_name)
{
    check_path("key prefix", key_prefix, key_prefix_max_bytes);
    check_path("target", target, target_max_bytes);
    if (generation < 1)
        throw std::invalid_argument("generation must be at least 1");
    if (attempt_id.empty())
        throw std::invalid_argument("attempt_id must not be empty");
    return std::string(key_prefix) + "/" + std::string(target) + "/" + std::string(attempt_id) +
           "/g" + std::to_string(generation) + "/" + safe_object_name(object_name);
}

const char *to_string(completion c) noexcept
{
    switch (c)
    {
    case completion::promoted:
        return protocol::attempt::promoted.data();  // the attempt's status now
    case completion::stale:
        return "stale";
    case completion::missing_blob:
        return "missing_blob";
    case completion::digest_mismatch:
        return protocol::attempt::digest_mismatch.data();  // the attempt's failure reason
    }
    return "stale";
}

completion complete_attempt(pg::connection &c, blob_store &blobs, const attempt_ref &attempt,
                            const finalizer &finalize, std::optional<digest> expected,
                            const std::string &schema, unsigned attempts)
{
    detail::check_schema(schema, "complete_attempt");
    if (attempt.status != protocol::attempt::pending && attempt.status != protocol::attempt::stored)
        throw std::invalid_argument("complete_attempt: the attempt is " + attempt.status +
                                    ", not pending or stored");
    const std::optional<digest> want = attempt.declared_digest ? attempt.declared_digest : expected;
    if (!want)
        throw std::invalid_argument(
            "complete_attempt: the attempt declared no digest: pass the expected one");
    const attempt_sql sql(schema);

    // What the store holds decides, never what was meant to be written.
    const std::optional<digest> found = blobs.digest_of(attempt.object_key);
    if (!found)
        return completion::missing_blob;
    if (*found != *want)
    {
        if (attempt.status == protocol::attempt::pending)
        {
            pg::transaction tx(c);
            const bool failed = fail(tx, sql, attempt, protocol::attempt::digest_mismatch);
            tx.commit();
            if (!failed)
                return completion::stale;
        }
        return completion::digest_mismatch;
    }

    for (unsigned n = 1;; ++n)
    {
        try
        {
            pg::transaction tx(c);
            if (attempt.status == protocol::attempt::pending && !store(tx, sql, attempt, *want))
                return completion::stale;  // rolled back by tx's destructor
            if (!promote(tx, sql, attempt, *want, finalize))
                return completion::stale;
            tx.commit();
            return completion::promoted;
        }
        catch (const pg::illegal_transition &)
        {
            return completion::stale;  // failed meanwhile: a promotion can never follow
        }
        catch (const pg::transaction_rollback &)
        {
            if (n >= attempts)
                throw;
        }
    }
}

// ---- the reconciler -----------------------------------------------------------

reconcile_report &reconcile_report::operator+=(const reconcile_report &o)
{
    examined += o.examined;
    promoted += o.promoted;
    reaped_no_blob += o.reaped_no_blob;
    digest_mismatch += o.digest_mismatch;
    left += o.left;
    stale += o.stale;
    errors += o.errors;
    swept_keys += o.swept_keys;
    swept_attempts += o.swept_attempts;
    pruned += o.pruned;
    return *this;
}

void reconciler_settings::validate() const
{
    if (grace.count() < 0)
        throw config_error("reconciler: grace must not be negative");
    if (batch < 1 || batch > 1000000)
        throw config_error("reconciler: batch must be between 1 and 1000000");
    if (interval < milliseconds(1) || interval > std::chrono::hours(24))
        throw config_error("reconciler: interval must be between 1 ms and 1 day");
    if (retention.count() < 0)
        throw config_error("reconciler: retention must not be negative");
    if (max_batches_per_pass < 1)
        throw config_error("reconciler: max_batches_per_pass must be at least 1");
    detail::check_schema(schema, "reconciler");
}

struct reconciler::state
{
    state(connection_provider &p, blob_store &b, reconciler_settings s)
        : provider(p), blobs(b), settings(std::move(s)), sql(settings.schema)
    {
    }

    connection_provider &provider;
    blob_store &blobs;
    reconciler_settings settings;
    attempt_sql sql;

    std::mutex mu;  // finalizers; with wake for run()'s pause
    std::condition_variable wake;
    bool stopping = false;
    std::map<std::string, finalizer> finalizers;

    void log(const std::string &line) const
    {
        if (settings.log)
            settings.log(line);
    }

    finalizer finalizer_of(const std::string &kind)
    {
        std::lock_guard<std::mutex> lk(mu);
        auto it = finalizers.find(kind);
        return it == finalizers.end() ? finalizer() : it->second;
    }

    // Finalizer and promotion of a verified attempt; false to roll back.
    bool finish(pg::transaction &tx, const attempt_ref &a, const digest &d, reconcile_report &rep)
    {
        const finalizer f = finalizer_of(a.kind);
        if (!f && a.mode == "append")
        {
            ++rep.left;
            log("attempt " + a.attempt_id + ": append kind " + a.kind +
                " has no finalizer; left stored, unpromoted");
            return true;
        }
        if (!promote(tx, sql, a, d, f))
        {
            ++rep.stale;
            return false;  // the finalizer's writes go with the savepoint
        }
        ++rep.promoted;
        return true;
    }

    // The decision table for one locked attempt; false to roll back its savepoint.
    bool reconcile_one(pg::transaction &tx, const attempt_ref &a, reconcile_report &rep)
    {
        const std::optional<digest> found = blobs.digest_of(a.object_key);
        if (a.status == protocol::attempt::pending)
        {
            if (!a.declared_digest || !found)
            {
                (fail(tx, sql, a, protocol::attempt::reaped_no_blob) ? rep.reaped_no_blob : rep.stale)++;
                return true;
            }
            if (*found != *a.declared_digest)
            {
                (fail(tx, sql, a, protocol::attempt::digest_mismatch) ? rep.digest_mismatch : rep.stale)++;
                return true;
            }
            if (!store(tx, sql, a, *found))
            {
                ++rep.stale;
                return true;
            }
            return finish(tx, a, *found, rep);
        }
        // stored: the declared digest is set (a table constraint).
        if (found && a.declared_digest && *found == *a.declared_digest)
            return finish(tx, a, *found, rep);
        ++rep.left;
        log("attempt " + a.attempt_id + " (stored): the blob at " + a.object_key +
            (found ? " does not have the declared digest" : " is missing") + "; left alone");
        return true;
    }

    reconcile_report reconcile_pass()
    {
        reconcile_report rep;
        std::set<std::string> seen;  // with grace 0 a left attempt comes straight back
        connection_handle conn = provider.acquire();
        for (int b = 0; b < settings.max_batches_per_pass; ++b)
        {
            pg::transaction tx(*conn);
            pg::result rows = tx.exec(sql.reconcile, settings.grace, settings.batch);
            bool fresh = false;
            for (std::size_t i = 0; i < rows.size(); ++i)
            {
                attempt_ref a;
                a.attempt_id = rows.get_text(i, 0);
                a.generation = rows.get_int(i, 1);
                a.status = rows.get_text(i, 2);
                a.kind = rows.get_text(i, 3);
                a.mode = rows.get_text(i, 4);
                a.target = rows.get_text(i, 5);
                a.object_key = rows.get_text(i, 6);
                a.declared_digest = digest_from(rows, i, 7);
                if (!seen.insert(a.attempt_id).second)
                    continue;
                fresh = true;
                ++rep.examined;

                reconcile_report one;
                tx.exec("SAVEPOINT idem_reconcile");
                bool keep = false;
                try
                {
                    keep = reconcile_one(tx, a, one);
                }
                catch (const pg::transaction_rollback &)
                {
                    throw;  // the whole batch is lost
                }
                catch (const pg::broken_connection &)
                {
                    throw;
                }
                catch (...)
                {
                    one = reconcile_report{};
                    one.errors = 1;
                    log("attempt " + a.attempt_id + ": " + detail::describe(std::current_exception()));
                }
                if (!keep)
                    tx.exec("ROLLBACK TO SAVEPOINT idem_reconcile");
                tx.exec("RELEASE SAVEPOINT idem_reconcile");
                rep += one;
            }
            tx.commit();
            if (rows.size() < static_cast<std::size_t>(settings.batch) || !fresh)
                break;
        }
        return rep;
    }

    reconcile_report sweep_pass()
    {
        reconcile_report rep;
        std::set<std::string> seen;  // an attempt whose blob cannot be removed waits for the next run
        connection_handle conn = provider.acquire();
        for (int b = 0; b < settings.max_batches_per_pass; ++b)
        {
            pg::transaction tx(*conn);
            pg::result rows = tx.exec(sql.sweep, settings.grace, settings.batch);
            std::size_t attempts = 0;
            bool fresh = false;
            // Rows come ordered by attempt, then generation: one group per attempt.
            for (std::size_t i = 0; i < rows.size();)
            {
                const std::string id = rows.get_text(i, 0);
                std::size_t end = i;
                while (end < rows.size() && rows.get_text(end, 0) == id)
                    ++end;
                ++attempts;
                if (seen.insert(id).second)
                {
                    fresh = true;
                    std::int64_t through = 0;
                    for (std::size_t j = i; j < end; ++j)
                    {
                        const std::string key = rows.get_text(j, 2);
                        try
                        {
                            blobs.remove(key);  // already gone counts as removed
                        }
                        catch (const std::exception &e)
                        {
                            log("sweep of " + key + " failed: " + e.what());
                            break;
                        }
                        ++rep.swept_keys;
                        through = rows.get_int(j, 1);
                    }
                    if (through > 0 && tx.exec(sql.swept, id, through).get_bool(0, 0))
                        ++rep.swept_attempts;
                }
                i = end;
            }
            tx.commit();
            if (attempts < static_cast<std::size_t>(settings.batch) || !fresh)
                break;
        }
        return rep;
    }

    reconcile_report prune_pass()
    {
        reconcile_report rep;
        connection_handle conn = provider.acquire();
        for (int b = 0; b < settings.max_batches_per_pass; ++b)
        {
            const auto n = conn->exec(sql.prune, settings.retention, settings.batch).get_int(0, 0);
            rep.pruned += static_cast<std::size_t>(n);
            if (n < settings.batch)
                break;
        }
        return rep;
    }
};

reconciler::reconciler(connection_provider &provider, blob_store &store, reconciler_settings settings)
{
    settings.validate();
    s_ = std::make_unique<state>(provider, store, std::move(settings));
}

reconciler::~reconciler() = default;

void reconciler::set_finalizer(const std::string &kind, finalizer f)
{
    std::lock_guard<std::mutex> lk(s_->mu);
    if (f)
        s_->finalizers[kind] = std::move(f);
    else
        s_->finalizers.erase(kind);
}

reconcile_report reconciler::reconcile_pass() { return s_->reconcile_pass(); }
reconcile_report reconciler::sweep_pass() { return s_->sweep_pass(); }
reconcile_report reconciler::prune_pass() { return s_->prune_pass(); }

reconcile_report reconciler::run_once()
{
    reconcile_report rep = s_->reconcile_pass();
    rep += s_->sweep_pass();
    rep += s_->prune_pass();
    return rep;
}

void reconciler::run()
{
    for (;;)
    {
        {
            std::lock_guard<std::mutex> lk(s_->mu);
            if (s_->stopping)
                return;
        }
        try
        {
            run_once();
        }
        catch (const std::exception &e)
        {
            s_->log(std::string("reconciler run failed: ") + e.what());
        }
        std::unique_lock<std::mutex> lk(s_->mu);
        if (s_->wake.wait_for(lk, s_->settings.interval, [&] { return s_->stopping; }))
            return;
    }
}

void reconciler::stop() noexcept
{
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->stopping = true;
    s_->wake.notify_all();
}

}  // namespace idem
