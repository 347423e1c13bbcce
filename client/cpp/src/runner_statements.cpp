// The SQL the runner sends and the rows it reads back.
#include "runner_engine.hpp"

#include <cctype>

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

// One more column for a statement run on the session that holds the
// wake-up lock (class $n, key $n + 1): it hands the lock over to the
// statement's own transaction. It takes the same lock at transaction level
// (granted at once to the session that holds it, waiters or not; CASE
// makes this happen first) and only then drops the session-level hold, so
// the lock is never free in between. The transaction-level hold lasts until
// the transaction ends, and PostgreSQL releases a transaction's locks after
// its commit is visible to other sessions (CommitTransaction:
// ProcArrayEndTransaction, then ResourceOwnerRelease of the locks): a
// follower blocked on the lock wakes up to the committed row, without a
// statement after the commit. True when the session-level hold was dropped.
// Placed last in the target list, which PostgreSQL evaluates left to right:
// an error raised by idem_finalize / idem_release / idem_fail comes before
// the hand-over, and the session still holds the lock for the fallback.
// (A subquery behind OFFSET 0 would order it too, but its second query
// level to parse and plan made every finalize measurably slower.)
std::string handing_lock_over(int n)
{
    const std::string cls = "$" + std::to_string(n), key = "$" + std::to_string(n + 1);
    return ", CASE WHEN pg_catalog.pg_try_advisory_xact_lock(" + cls + ", " + key +
           ") THEN pg_catalog.pg_advisory_unlock(" + cls + ", " + key + ") END";
}

}  // namespace

claim_row parse_row(const pg::result &r)
{
    if (r.size() != 1)
        throw pg::failure("pg_idem: expected one row from the claim function, got " +
                          std::to_string(r.size()));
    claim_row row;
    row.outcome = r.get_optional_text(0, 0).value_or("");
    row.claim_id = r.get_optional_text(0, 1).value_or("");
    row.generation = r.get_optional_int(0, 2).value_or(0);
    if (auto ms = r.get_optional_int(0, 3))
        row.retry_after = milliseconds(*ms);
    if (auto st = r.get_optional_int(0, 4))
        row.status = static_cast<int>(*st);
    row.headers_json = r.get_optional_text(0, 5);
    if (!r.is_null(0, 6))
        row.body = r.get_bytea(0, 6);
    if (!r.is_null(0, 7))
        row.lock_flag = r.get_bool(0, 7);
    return row;
}

statements::statements(const std::string &schema)
{
    const std::string p = schema.empty() ? "" : quote_ident(schema) + ".";
    const std::string cols =
        "SELECT r.outcome, r.claim_id::text, r.generation, "
        "ceil(extract(epoch FROM r.retry_after) * 1000)::int8, "
        "r.response_status, r.response_headers::text, r.response_body, ";
    // lock_timeout is set before idem_claim runs (the LATERAL reference
    // orders them) so a claim stuck behind an idem_begin transaction
    // gives up with the wait budget.
    claim = cols +
            "CASE WHEN $4 AND r.outcome IN ('claimed', 'recovered_ttl', 'recovered_abandoned') "
            "THEN pg_catalog.pg_try_advisory_lock($5, $6) "
            "WHEN $4 AND r.outcome = 'in_progress' "
            "THEN pg_catalog.pg_try_advisory_xact_lock_shared($5, $6) END "
            "FROM (SELECT pg_catalog.set_config('lock_timeout', $7, true) AS lt) s "
            "CROSS JOIN LATERAL " +
            p + "idem_claim($1, $2, CASE WHEN s.lt IS NOT NULL THEN $3::interval END) r";
    lookup = cols +
             "CASE WHEN $3 AND r.outcome = 'in_progress' "
             "THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END "
             "FROM " +
             p + "idem_lookup($1, $2) r";
    begin = cols +
            "CASE WHEN $3 AND r.outcome = 'in_progress' "
            "THEN pg_catalog.pg_try_advisory_xact_lock_shared($4, $5) END "
            "FROM " +
            p + "idem_begin($1, $2) r";
    renew = "SELECT CASE WHEN s.lt IS NOT NULL THEN " + p +
            "idem_renew($1, $2::uuid, $3::interval) IS NOT NULL END "
            "FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s";
    probe_renew = renew;
    // $7: the body is over the client's cap. The server stores a body
    // over idem.max_response_bytes as completed, not replayable, so the
    // runner lowers that setting to 0 for this transaction and sends one
    // byte instead of the whole body. The setting is read after the
    // finalize (which loads the library on a fresh connection).
    const std::string finalize_cols =
        "SELECT " + p +
        "idem_finalize($1, $2::uuid, $3::int4, $4::jsonb, $5, $6), "
        "pg_catalog.current_setting('idem.max_response_bytes', true)";
    const std::string finalize_from =
        " FROM (SELECT CASE WHEN $7 THEN pg_catalog.set_config("
        "'idem.max_response_bytes', '0', true) END AS forced) s";
    finalize = finalize_cols + finalize_from;
    release = "SELECT " + p + "idem_release($1, $2::uuid)";
    fail = "SELECT " + p + "idem_fail($1, $2::uuid, $3::interval)";
    finalize_unlock = finalize_cols + handing_lock_over(8) + finalize_from;
    release_unlock = release + handing_lock_over(3);
    fail_unlock = fail + handing_lock_over(4);
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
