// Key canonicalization and validation, against SHA-256 vectors computed
// independently (printf ... | sha256sum, Python hashlib).
#include <idem/error.hpp>
#include <idem/key.hpp>

#include <gtest/gtest.h>

#include <string>

using namespace std::string_literals;

TEST(Sha256, KnownVectors)
{
    EXPECT_EQ(idem::to_hex(idem::sha256("")),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(idem::to_hex(idem::sha256("abc")),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(idem::request_hash("abc"), idem::sha256("abc"));
}

TEST(CacheKey, CanonicalFormVectors)
{
    // printf 'pg_idem key v1\x00\x00\x00\x05alice\x00\x00\x00\x04POST\x00\x00\x00\x0b/orders?x=1\x00\x00\x00\x03k-1' | sha256sum
    EXPECT_EQ(idem::to_hex(idem::cache_key("alice", "POST", "/orders?x=1", "k-1")),
              "acd67533843f1eb2b68b62cb6ff54254ca3675fc76682fc08486fee1a559dd29");
    EXPECT_EQ(idem::to_hex(idem::cache_key("", "", "", "k")),
              "31bcb8800f3d5cb6ffb1104da4b82f432a4def50e151f13a16bed91e20961ccf");
    EXPECT_EQ(idem::to_hex(idem::cache_key("ünï", "PÖST", "/ä/ß?q=€", "🔑-ключ")),
              "ce13a8e3258d67fdb483c9ee4cc11a0ee2a3ce63d47341639f68ece24d7e63c1");
}

TEST(CacheKey, LengthPrefixPreventsDelimiterCollisions)
{
    EXPECT_EQ(idem::to_hex(idem::cache_key("ab", "c", "", "k")),
              "0eaf4b6f6fc8b1ebc363da5c08c18c1ef46fde68dc4bbac99a9ca2c8fdfd739b");
    EXPECT_EQ(idem::to_hex(idem::cache_key("a", "bc", "", "k")),
              "fe38ad46b9db1be05302cfe61373b1f19c93f07327e0b0a53653bcad9a4cc9a9");
    EXPECT_NE(idem::cache_key("alice", "POST", "/a", "k"), idem::cache_key("bob", "POST", "/a", "k"));
    EXPECT_NE(idem::cache_key("alice", "POST", "/a?x=1", "k"),
              idem::cache_key("alice", "POST", "/a?x=2", "k"));
}

TEST(CacheKey, RefusesWhatTheServerRefuses)
{
    EXPECT_THROW(idem::cache_key("p", "POST", "/", ""), idem::invalid_key);
    EXPECT_THROW(idem::cache_key("p", "POST", "/", std::string(256, 'k')), idem::invalid_key);
    EXPECT_NO_THROW(idem::cache_key("p", "POST", "/", std::string(255, 'k')));
    EXPECT_THROW(idem::cache_key("p", "POST", "/", "a\0b"s), idem::invalid_key);
    EXPECT_THROW(idem::cache_key("p", "POST", "/", "\xc3\x28"), idem::invalid_key);
}

TEST(KeyCheck, Statuses)
{
    EXPECT_EQ(idem::check_key("abc"), idem::key_status::ok);
    EXPECT_EQ(idem::check_key(""), idem::key_status::empty);
    EXPECT_EQ(idem::check_key(std::string(255, 'x')), idem::key_status::ok);
    EXPECT_EQ(idem::check_key(std::string(256, 'x')), idem::key_status::too_long);
    // 255 bytes of 2-byte characters would be 127.5 characters: bytes count, not characters.
    std::string two_byte;
    for (int i = 0; i < 128; ++i)
        two_byte += "é";
    EXPECT_EQ(idem::check_key(two_byte), idem::key_status::too_long);
    EXPECT_EQ(idem::check_key("a\0"s), idem::key_status::contains_nul);
    EXPECT_EQ(idem::check_key("\xff"), idem::key_status::invalid_utf8);
}

TEST(KeyCheck, HeaderValues)
{
    EXPECT_EQ(idem::check_key_header({}), idem::key_status::absent);
    EXPECT_EQ(idem::check_key_header({"a"}), idem::key_status::ok);
    EXPECT_EQ(idem::check_key_header({"a", "a"}), idem::key_status::duplicated);
    EXPECT_EQ(idem::check_key_header({""}), idem::key_status::empty);
    // One field with a comma is one (odd) key, not two.
    EXPECT_EQ(idem::check_key_header({"a, b"}), idem::key_status::ok);
    EXPECT_NE(std::string(idem::describe(idem::key_status::duplicated)).find("more than one"),
              std::string::npos);
}

TEST(Utf8, AcceptsWellFormed)
{
    EXPECT_TRUE(idem::is_valid_utf8(""));
    EXPECT_TRUE(idem::is_valid_utf8("plain ascii"));
    EXPECT_TRUE(idem::is_valid_utf8("\xc2\x80"));           // U+0080
    EXPECT_TRUE(idem::is_valid_utf8("\xed\x9f\xbf"));       // U+D7FF
    EXPECT_TRUE(idem::is_valid_utf8("\xee\x80\x80"));       // U+E000
    EXPECT_TRUE(idem::is_valid_utf8("\xf0\x9f\x94\x91"));   // U+1F511
    EXPECT_TRUE(idem::is_valid_utf8("\xf4\x8f\xbf\xbf"));   // U+10FFFF
}

TEST(Utf8, RefusesMalformed)
{
    EXPECT_FALSE(idem::is_valid_utf8("\x80"));              // lone continuation
    EXPECT_FALSE(idem::is_valid_utf8("\xc0\x80"));          // overlong NUL
    EXPECT_FALSE(idem::is_valid_utf8("\xc1\xbf"));          // overlong
    EXPECT_FALSE(idem::is_valid_utf8("\xe0\x80\x80"));      // overlong 3-byte
    EXPECT_FALSE(idem::is_valid_utf8("\xed\xa0\x80"));      // surrogate U+D800
    EXPECT_FALSE(idem::is_valid_utf8("\xf0\x80\x80\x80"));  // overlong 4-byte
    EXPECT_FALSE(idem::is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
    EXPECT_FALSE(idem::is_valid_utf8("\xf5\x80\x80\x80"));
    EXPECT_FALSE(idem::is_valid_utf8("\xe2\x82"));          // truncated
    EXPECT_FALSE(idem::is_valid_utf8("a\xe2\x82" "b"));
}
