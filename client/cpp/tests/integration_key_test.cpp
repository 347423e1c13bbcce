// The client's key and request hash equal the server's, and the server's
// errors map to the right exception classes.
#include "test_support.hpp"

#include <libpq-fe.h>

#include <random>

using namespace idem;

namespace {

std::string utf8(char32_t cp)
{
    std::string s;
    if (cp < 0x80)
        s += static_cast<char>(cp);
    else if (cp < 0x800)
    {
        s += static_cast<char>(0xc0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    else if (cp < 0x10000)
    {
        s += static_cast<char>(0xe0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    else
    {
        s += static_cast<char>(0xf0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    return s;
}

// Random valid UTF-8 without NUL, at most max_bytes long, from a mix of
// scripts: ASCII, Latin-1, Cyrillic, CJK, emoji, and the edges of the BMP.
std::string random_text(std::mt19937 &rng, std::size_t max_chars, std::size_t max_bytes)
{
    static const std::pair<char32_t, char32_t> ranges[] = {
        {0x20, 0x7e}, {0x01, 0x1f}, {0xa0, 0xff}, {0x400, 0x4ff}, {0x4e00, 0x9fff},
        {0x1f300, 0x1f64f}, {0xe000, 0xf8ff}, {0xd7f0, 0xd7ff}, {0xfff0, 0xfffd}, {0x10000, 0x10ffff},
    };
    std::uniform_int_distribution<std::size_t> len(0, max_chars);
    std::uniform_int_distribution<std::size_t> pick(0, std::size(ranges) - 1);
    std::string out;
    const std::size_t n = len(rng);
    for (std::size_t i = 0; i < n; ++i)
    {
        const auto &r = ranges[pick(rng)];
        std::uniform_int_distribution<std::uint32_t> cp(r.first, r.second);
        std::string c = utf8(cp(rng));
        if (out.size() + c.size() > max_bytes)
            break;
        out += c;
    }
    return out;
}

}  // namespace

TEST(ServerKey, ClientKeyEqualsServerOverRandomTuples)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> body_len(0, 300);
    for (int i = 0; i < 1000; ++i)
    {
        const std::string principal = random_text(rng, 20, 200);
        const std::string method = i % 3 ? random_text(rng, 6, 30) : std::string("POST");
        const std::string target = random_text(rng, 40, 400);
        std::string key = random_text(rng, 64, max_key_bytes);
        if (key.empty())
            key = "k";
        std::string body(static_cast<std::size_t>(body_len(rng)), '\0');
        for (char &ch : body)
            ch = static_cast<char>(byte(rng));
        pg::result r = c.exec("SELECT idem_key($1, $2, $3, $4), idem_request_hash($5), sha256($5)",
                              principal, method, target, key, pg::as_bytea(body));
        ASSERT_EQ(r.get_bytea(0, 0), to_bytes(cache_key(principal, method, target, key)))
            << "seed " << seed << " tuple " << i;
        ASSERT_EQ(r.get_bytea(0, 1), to_bytes(request_hash(body))) << "seed " << seed;
        ASSERT_EQ(r.get_bytea(0, 2), to_bytes(request_hash(body))) << "seed " << seed;
    }
}

TEST(ServerKey, LongestKeyAndEdgeLengths)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    std::string key255;
    while (key255.size() + 3 <= 255)
        key255 += "€";  // 3 bytes each
    while (key255.size() < 255)
        key255 += "x";
    ASSERT_EQ(key255.size(), 255u);
    pg::result r = c.exec("SELECT idem_key('', '', '', $1)", key255);
    EXPECT_EQ(r.get_bytea(0, 0), to_bytes(cache_key("", "", "", key255)));
}

TEST(ServerKey, ServerRefusesWhatTheClientRefuses)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    for (const std::string &bad : {std::string(), std::string(256, 'k')})
    {
        EXPECT_NE(check_key(bad), key_status::ok);
        try
        {
            c.exec("SELECT idem_key('p', 'POST', '/', $1)", bad);
            ADD_FAILURE() << "server accepted a key of " << bad.size() << " bytes";
        }
        catch (const pg::invalid_parameter_value &e)
        {
            EXPECT_EQ(e.sqlstate(), "22023");
        }
    }
    EXPECT_THROW(c.exec("SELECT idem_key(NULL, 'POST', '/', 'k')"), pg::null_value_not_allowed);
}

TEST(ServerErrors, FieldsReachTheException)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    c.exec("INSERT INTO uniq VALUES (1) ON CONFLICT DO NOTHING");
    try
    {
        c.exec("INSERT INTO uniq VALUES ($1)", 1);
        ADD_FAILURE() << "no unique violation";
    }
    catch (const pg::unique_violation &e)
    {
        EXPECT_EQ(e.sqlstate(), "23505");
        EXPECT_EQ(e.constraint(), "uniq_k");
        EXPECT_EQ(e.table(), "uniq");
        EXPECT_FALSE(e.detail().empty());
        EXPECT_EQ(e.sqlstate_class(), "23");
    }
    // A forged claim id with strict => true: IL001 with a hint.
    const std::string ck = to_bytes(cache_key("p", "POST", "/", idem_test::unique_key("forged")));
    try
    {
        c.exec("SELECT idem_finalize($1, gen_random_uuid(), 200, NULL, 'x'::bytea, true)",
               pg::as_bytea(ck));
        ADD_FAILURE() << "no IL001";
    }
    catch (const pg::lease_lost &e)
    {
        EXPECT_EQ(e.sqlstate(), "IL001");
        EXPECT_FALSE(e.hint().empty());
    }
    // Non-strict: false, nothing raised.
    EXPECT_FALSE(c.exec("SELECT idem_finalize($1, gen_random_uuid(), 200, NULL, 'x'::bytea)",
                        pg::as_bytea(ck))
                     .get_bool(0, 0));
    EXPECT_TRUE(c.is_open());
}

TEST(ServerErrors, TransactionRollsBackInDestructor)
{
    IDEM_REQUIRE_DB();
    pg::connection c(idem_test::dsn());
    const std::string key = idem_test::unique_key("rb");
    {
        pg::transaction tx(c);
        tx.exec("INSERT INTO effects(key) VALUES ($1)", key);
    }
    EXPECT_EQ(c.status(), pg::transaction_status::idle);
    EXPECT_EQ(idem_test::count_rows("effects", key), 0);
    {
        pg::transaction tx(c);
        tx.exec("INSERT INTO effects(key) VALUES ($1)", key);
        tx.commit();
    }
    EXPECT_EQ(idem_test::count_rows("effects", key), 1);
}

TEST(Retry, TransactRetriesARealSerializationFailure)
{
    IDEM_REQUIRE_DB();
    simple_pool pool(idem_test::dsn());
    pg::connection setup(idem_test::dsn());
    setup.exec("INSERT INTO counters VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0");
    int attempts = 0;
    transact(
        pool,
        [&](pg::transaction &tx) {
            ++attempts;
            const auto n = tx.exec("SELECT n FROM counters WHERE id = 1").get_int(0, 0);
            if (attempts == 1)
            {
                pg::connection other(idem_test::dsn());
                other.exec("UPDATE counters SET n = n + 100 WHERE id = 1");
            }
            tx.exec("UPDATE counters SET n = $1 WHERE id = 1", n + 1);
        },
        retry_policy{3, std::chrono::milliseconds(1)}, pg::isolation::repeatable_read);
    EXPECT_EQ(attempts, 2);
    EXPECT_EQ(setup.exec("SELECT n FROM counters WHERE id = 1").get_int(0, 0), 101);
}

TEST(Connection, AdoptAndRelease)
{
    IDEM_REQUIRE_DB();
    PGconn *raw = PQconnectdb(idem_test::dsn().c_str());
    ASSERT_EQ(PQstatus(raw), CONNECTION_OK);
    {
        pg::connection c = pg::connection::adopt(raw);
        EXPECT_EQ(c.exec("SELECT 41 + $1::int", 1).get_int(0, 0), 42);
        EXPECT_EQ(c.release(), raw);
        EXPECT_FALSE(c.is_open());
    }
    EXPECT_EQ(PQstatus(raw), CONNECTION_OK);  // still open: ownership went back
    PQfinish(raw);
    EXPECT_THROW(pg::connection::adopt(nullptr), pg::broken_connection);
}
