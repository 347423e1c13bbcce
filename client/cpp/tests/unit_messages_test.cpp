// Messages and attempts without a server: the filesystem blob store's
// conditional create, object keys, settings checks, SQLSTATE mapping and
// the error texts recorded by nacks and failures.
#include <idem/inbox.hpp>
#include <idem/outbox.hpp>
#include <idem/reconciler.hpp>

#include "../src/messaging/detail.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace idem;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

class BlobStore : public ::testing::Test
{
protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/idem_unit_blobs.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Files under the root whose name marks an unfinished put.
    int leftovers() const
    {
        int n = 0;
        for (const auto &e : fs::recursive_directory_iterator(dir_))
            if (e.path().filename().string().rfind(".~put.", 0) == 0)
                ++n;
        return n;
    }

    fs::path dir_;
};

// A provider for constructors that must not connect.
class no_provider : public connection_provider
{
public:
    connection_handle acquire() override { throw pg::broken_connection("no database in unit tests"); }
};

// A store for constructors that must not touch one.
class no_blobs : public blob_store
{
public:
    put_outcome put_if_absent(const std::string &, std::string_view) override { throw std::logic_error("unused"); }
    std::optional<digest> digest_of(const std::string &) override { return std::nullopt; }
    std::optional<std::string> get(const std::string &) override { return std::nullopt; }
    bool exists(const std::string &) override { return false; }
    bool remove(const std::string &) override { return false; }
};

}  // namespace

TEST_F(BlobStore, SecondPutOfAKeyIsExistsAndChangesNothing)
{
    filesystem_blob_store store(dir_);
    const std::string key = "docs/acct-7/0b6f/g1/report.pdf";
    EXPECT_FALSE(store.exists(key));
    EXPECT_EQ(store.put_if_absent(key, "first"), put_outcome::created);
    EXPECT_EQ(store.put_if_absent(key, "second, longer content"), put_outcome::exists);
    EXPECT_EQ(store.get(key), "first");
    EXPECT_EQ(store.digest_of(key), sha256("first"));
    EXPECT_TRUE(store.exists(key));
    EXPECT_EQ(leftovers(), 0);
}

TEST_F(BlobStore, ConcurrentPutsOfOneKeyLeaveExactlyOne)
{
    filesystem_blob_store store(dir_, false);
    constexpr int threads = 8;
    std::atomic<int> created{0}, ready{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i)
        ts.emplace_back([&, i] {
            ready++;
            while (ready.load() < threads)
                std::this_thread::yield();
            if (store.put_if_absent("race/key", std::string(4096, static_cast<char>('a' + i))) ==
                put_outcome::created)
                created++;
        });
    for (auto &t : ts)
        t.join();
    EXPECT_EQ(created.load(), 1);
    const std::string got = store.get("race/key").value();
    ASSERT_EQ(got.size(), 4096u);
    EXPECT_EQ(got, std::string(4096, got[0]));  // one writer's bytes, whole
    EXPECT_EQ(leftovers(), 0);
}

TEST_F(BlobStore, AbsentKeysAndRemove)
{
    filesystem_blob_store store(dir_);
    EXPECT_EQ(store.get("a/b"), std::nullopt);
    EXPECT_EQ(store.digest_of("a/b"), std::nullopt);
    EXPECT_FALSE(store.remove("a/b"));
    ASSERT_EQ(store.put_if_absent("a/b", "x"), put_outcome::created);
    // A key under a file is absent, not an error.
    EXPECT_FALSE(store.exists("a/b/c"));
    EXPECT_EQ(store.digest_of("a/b/c"), std::nullopt);
    EXPECT_TRUE(store.remove("a/b"));
    EXPECT_FALSE(store.exists("a/b"));
    EXPECT_EQ(store.put_if_absent("a/b", "y"), put_outcome::created);
    EXPECT_EQ(store.get("a/b"), "y");
}

TEST_F(BlobStore, DigestOfALargeBlobIsItsSha256)
{
    filesystem_blob_store store(dir_, false);
    std::string big(3 * 1024 * 1024 + 17, '\0');
    for (std::size_t i = 0; i < big.size(); ++i)
        big[i] = static_cast<char>(i * 131 % 251);
    ASSERT_EQ(store.put_if_absent("big/blob", big), put_outcome::created);
    EXPECT_EQ(store.digest_of("big/blob"), sha256(big));
    EXPECT_EQ(store.put_if_absent("empty", ""), put_outcome::created);
    EXPECT_EQ(store.digest_of("empty"), sha256(""));
}

TEST_F(BlobStore, RefusesKeysThatAreNotObjectKeys)
{
    filesystem_blob_store store(dir_);
    for (const char *bad : {"", "/etc/passwd", "a//b", "../x", "a/./b", "a/..", "a b", "a/.~put.1",
                            "trailing/", "back\\slash"})
    {
        EXPECT_THROW(store.put_if_absent(bad, "x"), std::invalid_argument) << bad;
        EXPECT_THROW(store.digest_of(bad), std::invalid_argument) << bad;
    }
    EXPECT_THROW(check_object_key(std::string(1025, 'a')), std::invalid_argument);
    EXPECT_NO_THROW(check_object_key("docs/acct-7/reports/0b6f-11/g12/q3_report.pdf"));
    EXPECT_NO_THROW(check_object_key(".hidden-is-a-name"));
    EXPECT_TRUE(fs::is_empty(dir_));
}

TEST(ObjectKey, SafeNamesAndKeys)
{
    EXPECT_EQ(safe_object_name("report.pdf"), "report.pdf");
    EXPECT_EQ(safe_object_name("../../etc/passwd"), "passwd");
    EXPECT_EQ(safe_object_name("C:\\dir\\My File (1).txt"), "My_File_1_.txt");
    EXPECT_EQ(safe_object_name("..hidden"), "hidden");
    EXPECT_EQ(safe_object_name("a__b"), "a_b");
    EXPECT_EQ(safe_object_name("\xC3\xA9t\xC3\xA9.csv"), "_t_.csv");
    EXPECT_EQ(safe_object_name(std::string(150, 'a') + ".json"), std::string(95, 'a') + ".json");
    EXPECT_EQ(safe_object_name(safe_object_name("My File (1).txt")), "My_File_1_.txt");
    EXPECT_THROW(safe_object_name(""), std::invalid_argument);
    EXPECT_THROW(safe_object_name("..."), std::invalid_argument);
    EXPECT_EQ(object_key("docs", "acct-7/reports", "0b6f", 3, "Q3 report.pdf"),
              "docs/acct-7/reports/0b6f/g3/Q3_report.pdf");
    EXPECT_THROW(object_key("docs", "a//b", "0b6f", 1, "n"), std::invalid_argument);
    EXPECT_THROW(object_key("", "t", "0b6f", 1, "n"), std::invalid_argument);
    EXPECT_THROW(object_key("docs", "t", "0b6f", 0, "n"), std::invalid_argument);
}

TEST(MessageSettings, BadValuesAreRefused)
{
    no_provider p;
    inbox_settings in;
    EXPECT_NO_THROW(in.validate());
    in.max_attempts = 1001;
    EXPECT_THROW(in.validate(), config_error);
    in = {};
    in.handler_attempts = 0;
    EXPECT_THROW(inbox(p, in), config_error);

    auto ok = [](const outbox_event &) { return publish_result::ok(); };
    drainer_settings d;
    EXPECT_EQ(d.effective_lease_margin(), 6000ms);
    d.batch = 0;
    EXPECT_THROW(drainer(p, ok, d), config_error);
    d = {};
    d.lease = 5ms;
    EXPECT_THROW(d.validate(), config_error);
    d = {};
    d.lease_margin = d.lease;
    EXPECT_THROW(d.validate(), config_error);
    d = {};
    d.idle_wait = 0ms;
    EXPECT_THROW(d.validate(), config_error);
    EXPECT_THROW(drainer(p, publisher(), drainer_settings{}), config_error);

    no_blobs none;
    reconciler_settings r;
    EXPECT_EQ(r.grace, std::chrono::hours(1));
    EXPECT_EQ(r.batch, 100);
    EXPECT_EQ(r.interval, std::chrono::minutes(5));
    EXPECT_EQ(r.retention, std::chrono::hours(24 * 31));
    r.grace = -1ms;
    EXPECT_THROW(reconciler(p, none, r), config_error);
    r = {};
    r.batch = 0;
    EXPECT_THROW(r.validate(), config_error);
    r = {};
    r.interval = 0ms;
    EXPECT_THROW(r.validate(), config_error);
    r = {};
    r.retention = -1ms;
    EXPECT_THROW(r.validate(), config_error);
}

TEST(MessageErrors, SqlstatesMapToTheirClasses)
{
    auto thrown = [](const char *state) -> std::exception_ptr {
        pg::error_fields f;
        f.sqlstate = state;
        f.message = "m";
        try
        {
            pg::throw_sql_error(f);
        }
        catch (...)
        {
            return std::current_exception();
        }
    };
    EXPECT_THROW(std::rethrow_exception(thrown("IL003")), pg::inbox_unfinished);
    EXPECT_THROW(std::rethrow_exception(thrown("IL003")), pg::idem_error);
    EXPECT_THROW(std::rethrow_exception(thrown("IL005")), pg::illegal_transition);
    EXPECT_THROW(std::rethrow_exception(thrown("IL006")), pg::promotion_unpublished);
    EXPECT_THROW(std::rethrow_exception(thrown("55000")), pg::object_not_in_prerequisite_state);
    EXPECT_THROW(std::rethrow_exception(thrown("22023")), pg::invalid_parameter_value);
    EXPECT_THROW(std::rethrow_exception(thrown("22021")), pg::data_exception);
}

TEST(MessageErrors, RecordedTextsAreValidUtf8WithinTheLimit)
{
    EXPECT_EQ(detail::error_text("plain", 100), "plain");
    EXPECT_EQ(detail::error_text(std::string("a\0b", 3), 100), "a b");
    EXPECT_EQ(detail::error_text("bad \xFF byte", 100), "bad ? byte");
    EXPECT_EQ(detail::error_text("cut \xC3", 100), "cut ?");
    EXPECT_EQ(detail::error_text("\xC3\xA9\xC3\xA9", 3), "\xC3\xA9");  // never half a character
    EXPECT_EQ(detail::qualified("", "idem_outbox_ack"), "idem_outbox_ack");
    EXPECT_EQ(detail::qualified("my \"s\"", "f"), "\"my \"\"s\"\"\".f");
    EXPECT_EQ(std::string(to_string(inbox_outcome::retry)), "retry");
    EXPECT_EQ(std::string(to_string(completion::digest_mismatch)), "digest_mismatch");
}
