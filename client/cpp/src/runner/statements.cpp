// The SQL the runner sends and the rows it reads back.
#include "runner/engine.hpp"

#include <cctype>
#include <cstdio>
#include <ctime>

namespace idem::detail {

namespace {

// A double-quoted SQL identifier.
std::string quote_ident(const std::string &s)
{
    std::string out = "\"";
    for (char c : s)
    {
        if (c == '"')
            out += '"';
        out += c;
    }
    return out + "\"";
}

// The max_wait argument from parameters $n (interval) and $n + 1 (the
// deadline as timestamptz): the smaller, never negative.
std::string wait_arg(int n)
{
    const std::string w = "$" + std::to_string(n), d = "$" + std::to_string(n + 1);
    return "GREATEST(LEAST(" + w + "::interval, " + d +
           "::timestamptz OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()), '0'::interval)";
}

}  // namespace

std::string wall_clock_in(milliseconds d)
{
    const auto t = std::chrono::system_clock::now() + d;
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    const std::time_t secs = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06lld+00", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(us % 1000000));
    return buf;
}

claim_row parse_row(const pg::result &r)
{
    if (r.size() != 1)
        throw pg::failure("pg_idem: expected one row from the claim function, got " +
                          std::to_string(r.size()));
    claim_row row;
    row.outcome = r.get_optional_text(0, 0).value_or("");
    row.kind = protocol::parse_server_outcome(row.outcome);
    row.claim_id = r.get_optional_text(0, 1).value_or("");
    row.generation = r.get_optional_int(0, 2).value_or(0);
    if (auto ms = r.get_optional_int(0, 3))
        row.retry_after = milliseconds(*ms);
    if (auto st = r.get_optional_int(0, 4))
        row.status = static_cast<int>(*st);
    row.headers_json = r.get_optional_text(0, 5);
    if (!r.is_null(0, 6))
        row.body = r.get_bytea(0, 6);
    return row;
}

statements::statements(const std::string &schema)
{
    const std::string p = schema.empty() ? "" : quote_ident(schema) + ".";
    const std::string cols =
        "SELECT r.outcome, r.claim_id::text, r.generation, "
        "ceil(extract(epoch FROM r.retry_after) * 1000)::int8, "
        "r.response_status, r.response_headers::text, r.response_body";
    // $1 cache key, $2 request hash, $3 lease, $4 lock_wait, $5 max_wait,
    // $6 the client's deadline (wall clock). The server waits the smaller
    // of the two: a statement that sat in a pooler's queue (every server
    // connection busy, e.g. with other waiters) waits only what is left,
    // and clock skew can only shorten the wait, never lengthen it.
    // lock_wait (pg_idem 0.6.0, for the call only) makes a claim stuck
    // behind an idem_begin transaction give up with the wait budget.
    const std::string claim_fn = " FROM " + p + "idem_claim($1, $2, $3::interval, ";
    plain.claim = cols + claim_fn + "NULL::interval, $4::interval) r";
    plain.claim_wait = cols + claim_fn + wait_arg(5) + ", $4::interval) r";
    lookup = cols + " FROM " + p + "idem_lookup($1, $2) r";
    // $1, $2 as above, $3 lock_wait, $4 max_wait, $5 deadline. Duplicates
    // wait inside idem_begin for the first transaction: lock_wait bounds
    // that wait by the budget, for idem_begin only, so the handler runs
    // with the transaction's own lock_timeout.
    const std::string begin_fn = " FROM " + p + "idem_begin($1, $2, NULL::interval, ";
    plain.begin = cols + begin_fn + "NULL::interval, $3::interval) r";
    plain.begin_wait = cols + begin_fn + wait_arg(4) + ", $3::interval) r";
    // $1 cache key, $2 claim id, $3 lease, $4 lock_wait.
    plain.renew = "SELECT " + p + "idem_renew($1, $2::uuid, $3::interval, $4::interval) IS NOT NULL";

    // The same parameters for 0.3.0 - 0.5.x: lock_wait set as lock_timeout
    // (for the statement's transaction only) before the call runs (the
    // LATERAL reference orders them); idem_begin's last column puts the
    // caller's setting back (read before it was changed).
    const std::string claim_from = " FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s "
                                   "CROSS JOIN LATERAL " +
                                   p + "idem_claim($1, $2, CASE WHEN s.lt IS NOT NULL THEN $3::interval END";
    legacy.claim = cols + claim_from + ") r";
    legacy.claim_wait = cols + claim_from + ", " + wait_arg(5) + ") r";
    const std::string begin_from = ", pg_catalog.set_config('lock_timeout', s.old, true) "
                                   "FROM (SELECT pg_catalog.current_setting('lock_timeout') AS old, "
                                   "pg_catalog.set_config('lock_timeout', $3, true) AS lt) s "
                                   "CROSS JOIN LATERAL " +
                                   p + "idem_begin($1, $2, CASE WHEN s.lt IS NOT NULL THEN NULL::interval END";
    legacy.begin = cols + begin_from + ") r";
    legacy.begin_wait = cols + begin_from + ", " + wait_arg(4) + ") r";
    legacy.renew = "SELECT CASE WHEN s.lt IS NOT NULL THEN " + p +
                   "idem_renew($1, $2::uuid, $3::interval) IS NOT NULL END "
                   "FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s";
    // $7: the body is over the client's cap. The server stores a body over
    // idem.max_response_bytes as completed, not replayable, so the runner
    // lowers that setting to 0 for this transaction and sends one byte
    // instead of the whole body. The setting is read after the finalize
    // (which loads the library on a fresh connection).
    finalize = "SELECT " + p +
               "idem_finalize($1, $2::uuid, $3::int4, $4::jsonb, $5, $6), "
               "pg_catalog.current_setting('idem.max_response_bytes', true)"
               " FROM (SELECT CASE WHEN $7 THEN pg_catalog.set_config("
               "'idem.max_response_bytes', '0', true) END AS forced) s";
    release = "SELECT " + p + "idem_release($1, $2::uuid)";
    fail = "SELECT " + p + "idem_fail($1, $2::uuid, $3::interval)";
}

// idem.max_response_bytes as shown by current_setting ("2MB", "1024", "-1").
std::optional<std::size_t> parse_size_setting(const std::optional<std::string> &text)
{
    if (!text || text->empty())
        return std::nullopt;
    std::size_t i = 0;
    long long n = 0;
    bool neg = false;
    if ((*text)[0] == '-')
        neg = true, i = 1;
    for (; i < text->size() && std::isdigit(static_cast<unsigned char>((*text)[i])); ++i)
        n = n * 10 + ((*text)[i] - '0');
    if (neg)
        return std::nullopt;
    std::string unit = text->substr(i);
    long long mult = 1;
    if (unit == "kB")
        mult = 1024;
    else if (unit == "MB")
        mult = 1024LL * 1024;
    else if (unit == "GB")
        mult = 1024LL * 1024 * 1024;
    else if (unit == "TB")
        mult = 1024LL * 1024 * 1024 * 1024;
    else if (!unit.empty() && unit != "B")
        return std::nullopt;
    return static_cast<std::size_t>(n * mult);
}

}  // namespace idem::detail
