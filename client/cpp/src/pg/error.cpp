// SQLSTATE to exception mapping.
#include <idem/error.hpp>

#include <utility>

namespace idem::pg {

broken_connection::broken_connection(const std::string &what, std::string sqlstate)
    : failure(what), sqlstate_(std::move(sqlstate))
{
}

unknown_outcome::unknown_outcome(const std::string &what, std::string sqlstate)
    : failure(what), sqlstate_(std::move(sqlstate))
{
}

namespace {

// "ERROR:  msg" plus detail and hint, the way psql shows it.
std::string describe(const error_fields &f)
{
    std::string s = f.message.empty() ? std::string("unknown server error") : f.message;
    if (!f.sqlstate.empty())
        s += " (SQLSTATE " + f.sqlstate + ")";
    if (!f.detail.empty())
        s += "\nDETAIL:  " + f.detail;
    if (!f.hint.empty())
        s += "\nHINT:  " + f.hint;
    return s;
}

}  // namespace

sql_error::sql_error(error_fields fields) : failure(describe(fields)), f_(std::move(fields)) {}

[[noreturn]] void throw_sql_error(error_fields f)
{
    const std::string code = f.sqlstate;
    const std::string cls = code.substr(0, 2);
    if (code == "22023")
        throw invalid_parameter_value(std::move(f));
    if (code == "22004")
        throw null_value_not_allowed(std::move(f));
    if (cls == "22")
        throw data_exception(std::move(f));
    if (code == "23502")
        throw not_null_violation(std::move(f));
    if (code == "23503")
        throw foreign_key_violation(std::move(f));
    if (code == "23505")
        throw unique_violation(std::move(f));
    if (code == "23514")
        throw check_violation(std::move(f));
    if (code == "23P01")
        throw exclusion_violation(std::move(f));
    if (cls == "23")
        throw integrity_constraint_violation(std::move(f));
    if (code == "40001")
        throw serialization_failure(std::move(f));
    if (code == "40P01")
        throw deadlock_detected(std::move(f));
    if (cls == "40")
        throw transaction_rollback(std::move(f));
    if (code == "42883")
        throw undefined_function(std::move(f));
    if (cls == "42")
        throw syntax_error_or_access_rule_violation(std::move(f));
    if (code == "55P03")
        throw lock_not_available(std::move(f));
    if (code == "57014")
        throw query_canceled(std::move(f));
    if (code == "55000")
        throw object_not_in_prerequisite_state(std::move(f));
    if (code == "IL001")
        throw lease_lost(std::move(f));
    if (code == "IL002")
        throw claim_unfinished(std::move(f));
    if (code == "IL003")
        throw inbox_unfinished(std::move(f));
    if (code == "IL005")
        throw illegal_transition(std::move(f));
    if (code == "IL006")
        throw promotion_unpublished(std::move(f));
    if (cls == "IL")
        throw idem_error(std::move(f));
    throw sql_error(std::move(f));
}

}  // namespace idem::pg
