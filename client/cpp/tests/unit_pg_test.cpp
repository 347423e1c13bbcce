// libpq wrappers without a server: parameters, SQLSTATE mapping, retry rules.
#include <idem/pg.hpp>
#include <idem/retry.hpp>

#include <gtest/gtest.h>

#include <optional>

using namespace idem;
using namespace std::chrono_literals;

TEST(Params, Conversions)
{
    auto p = pg::to_param("abc");
    EXPECT_EQ(p.value(), "abc");
    EXPECT_EQ(p.wire_format(), pg::format::text);
    EXPECT_TRUE(pg::to_param(std::nullopt).is_null());
    EXPECT_TRUE(pg::to_param(static_cast<const char *>(nullptr)).is_null());
    EXPECT_TRUE(pg::to_param(std::optional<int>()).is_null());
    EXPECT_EQ(pg::to_param(std::optional<int>(7)).value(), "7");
    auto i = pg::to_param(std::int64_t(-42));
    EXPECT_EQ(i.value(), "-42");
    EXPECT_EQ(i.type(), pg::int8_oid);
    EXPECT_EQ(pg::to_param(5).type(), pg::int4_oid);
    EXPECT_EQ(pg::to_param(true).value(), "true");
    auto b = pg::to_param(pg::as_bytea(std::string("\0\1\2", 3)));
    EXPECT_EQ(b.wire_format(), pg::format::binary);
    EXPECT_EQ(b.type(), pg::bytea_oid);
    EXPECT_EQ(b.value().size(), 3u);
    auto d = pg::to_param(std::chrono::milliseconds(1500));
    EXPECT_EQ(d.value(), "1500000 microseconds");
    EXPECT_EQ(d.type(), pg::interval_oid);
}

namespace {
pg::error_fields fields(const char *state)
{
    pg::error_fields f;
    f.sqlstate = state;
    f.message = "msg";
    f.detail = "det";
    f.hint = "hint";
    f.constraint = "c_name";
    return f;
}

template <typename E>
void expect_maps(const char *state)
{
    try
    {
        pg::throw_sql_error(fields(state));
    }
    catch (const E &e)
    {
        EXPECT_EQ(e.sqlstate(), state);
        EXPECT_EQ(e.detail(), "det");
        EXPECT_EQ(e.hint(), "hint");
        EXPECT_EQ(e.constraint(), "c_name");
        EXPECT_NE(std::string(e.what()).find(state), std::string::npos);
        return;
    }
    catch (...)
    {
    }
    ADD_FAILURE() << state << " did not map to the expected class";
}
}  // namespace

TEST(Errors, KeyedBySqlstate)
{
    expect_maps<pg::serialization_failure>("40001");
    expect_maps<pg::transaction_rollback>("40001");
    expect_maps<pg::deadlock_detected>("40P01");
    expect_maps<pg::transaction_rollback>("40002");
    expect_maps<pg::unique_violation>("23505");
    expect_maps<pg::check_violation>("23514");
    expect_maps<pg::integrity_constraint_violation>("23505");
    expect_maps<pg::invalid_parameter_value>("22023");
    expect_maps<pg::null_value_not_allowed>("22004");
    expect_maps<pg::data_exception>("22P02");
    expect_maps<pg::lock_not_available>("55P03");
    expect_maps<pg::query_canceled>("57014");
    expect_maps<pg::lease_lost>("IL001");
    expect_maps<pg::claim_unfinished>("IL002");
    expect_maps<pg::idem_error>("IL001");
    expect_maps<pg::undefined_function>("42883");
    expect_maps<pg::sql_error>("XX000");
}

TEST(Errors, SqlstateClass)
{
    pg::sql_error e(fields("23505"));
    EXPECT_EQ(e.sqlstate_class(), "23");
}

TEST(Connection, BadConninfoIsBrokenConnection)
{
    EXPECT_THROW(pg::connection("host=/nonexistent-idem-dir port=1 connect_timeout=1"),
                 pg::broken_connection);
}

TEST(Retry, RetriesSerializationAndDeadlockOnly)
{
    int calls = 0;
    int got = perform(
        [&] {
            ++calls;
            if (calls == 1)
                pg::throw_sql_error(fields("40001"));
            if (calls == 2)
                pg::throw_sql_error(fields("40P01"));
            return 7;
        },
        retry_policy{3, 0ms});
    EXPECT_EQ(got, 7);
    EXPECT_EQ(calls, 3);
}

TEST(Retry, GivesUpAfterAttempts)
{
    int calls = 0;
    EXPECT_THROW(perform(
                     [&] {
                         ++calls;
                         pg::throw_sql_error(fields("40001"));
                     },
                     retry_policy{3, 0ms}),
                 pg::serialization_failure);
    EXPECT_EQ(calls, 3);
}

TEST(Retry, NeverRetriesUnknownOutcome)
{
    int calls = 0;
    EXPECT_THROW(perform(
                     [&] {
                         ++calls;
                         throw pg::unknown_outcome("lost during COMMIT");
                     },
                     retry_policy{5, 0ms}),
                 pg::unknown_outcome);
    EXPECT_EQ(calls, 1);
}

TEST(Retry, DoesNotRetryOtherErrors)
{
    int calls = 0;
    EXPECT_THROW(perform(
                     [&] {
                         ++calls;
                         pg::throw_sql_error(fields("23505"));
                     },
                     retry_policy{5, 0ms}),
                 pg::unique_violation);
    EXPECT_EQ(calls, 1);
}
