// Client-side key validation and digests, byte-identical to the server.
#include <idem/error.hpp>
#include <idem/key.hpp>

#include <openssl/evp.h>

#include <memory>
#include <stdexcept>

namespace idem {

namespace {

// The protocol's domain separator (hashed without a terminator).
constexpr std::string_view key_domain = protocol::key_domain;

struct md_ctx_free
{
    void operator()(EVP_MD_CTX *c) const noexcept { EVP_MD_CTX_free(c); }
};

class hasher
{
public:
    hasher() : ctx_(EVP_MD_CTX_new())
    {
        if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
            throw std::runtime_error("OpenSSL: cannot initialise SHA-256");
    }
    void update(const void *p, std::size_t n)
    {
        if (n && EVP_DigestUpdate(ctx_.get(), p, n) != 1)
            throw std::runtime_error("OpenSSL: SHA-256 update failed");
    }
    // The length-prefixed field: uint32 big-endian byte length, then the bytes.
    void field(std::string_view s)
    {
        if (s.size() > 0xffffffffu)
            throw invalid_key("idem_key: field longer than 4 GiB");
        const auto n = static_cast<std::uint32_t>(s.size());
        const unsigned char len[4] = {static_cast<unsigned char>(n >> 24),
                                      static_cast<unsigned char>(n >> 16),
                                      static_cast<unsigned char>(n >> 8),
                                      static_cast<unsigned char>(n)};
        update(len, 4);
        update(s.data(), s.size());
    }
    digest finish()
    {
        digest d{};
        unsigned int len = 0;
        if (EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) != 1 || len != d.size())
            throw std::runtime_error("OpenSSL: SHA-256 final failed");
        return d;
    }

private:
    std::unique_ptr<EVP_MD_CTX, md_ctx_free> ctx_;
};

}  // namespace

bool is_valid_utf8(std::string_view s) noexcept
{
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    const std::size_t n = s.size();
    std::size_t i = 0;
    while (i < n)
    {
        const unsigned char c = p[i];
        if (c < 0x80)
        {
            ++i;
            continue;
        }
        std::size_t len;
        unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
        if (c >= 0xc2 && c <= 0xdf)
            len = 2;
        else if (c == 0xe0)
            len = 3, lo = 0xa0;
        else if (c == 0xed)
            len = 3, hi = 0x9f;  // no UTF-16 surrogates
        else if (c >= 0xe1 && c <= 0xef)
            len = 3;
        else if (c == 0xf0)
            len = 4, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3)
            len = 4;
        else if (c == 0xf4)
            len = 4, hi = 0x8f;  // nothing above U+10FFFF
        else
            return false;  // continuation byte, overlong lead, or 0xf5..0xff
        if (i + len > n)
            return false;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return false;
        for (std::size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xbf)
                return false;
        i += len;
    }
    return true;
}

key_status check_key(std::string_view key) noexcept
{
    if (key.empty())
        return key_status::empty;
    if (key.size() > max_key_bytes)
        return key_status::too_long;
    if (key.find('\0') != std::string_view::npos)
        return key_status::contains_nul;
    if (!is_valid_utf8(key))
        return key_status::invalid_utf8;
    return key_status::ok;
}

key_status check_key_header(const std::vector<std::string_view> &values) noexcept
{
    if (values.empty())
        return key_status::absent;
    if (values.size() > 1)
        return key_status::duplicated;
    return check_key(values.front());
}

const char *describe(key_status s) noexcept
{
    // The generated sentences are string literals: data() is NUL-terminated.
    return protocol::describe(s).data();
}

digest sha256(std::string_view bytes)
{
    hasher h;
    h.update(bytes.data(), bytes.size());
    return h.finish();
}

digest cache_key(std::string_view principal, std::string_view method, std::string_view target,
                 std::string_view key)
{
    const key_status st = check_key(key);
    if (st != key_status::ok)
        throw invalid_key(describe(st));
    hasher h;
    h.update(key_domain.data(), key_domain.size());
    h.field(principal);
    h.field(method);
    h.field(target);
    h.field(key);
    return h.finish();
}

std::string to_hex(const digest &d)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(d.size() * 2);
    for (std::uint8_t b : d)
    {
        out.push_back(digits[b >> 4]);
        out.push_back(digits[b & 0xf]);
    }
    return out;
}

}  // namespace idem
