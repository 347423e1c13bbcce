// pg_idem C++ client: Idempotency-Key validation, cache key and request hash.
//
// The digests are byte-identical to the server's idem_key() and
// idem_request_hash(), so a client can compute them without a round trip:
//
//   cache key    = SHA-256("pg_idem key v1" || for each of principal, method,
//                  target, key: uint32_be(byte length) || bytes)
//   request hash = SHA-256(body)
#pragma once

#include <idem/protocol.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

using digest = std::array<std::uint8_t, 32>;

// The longest key accepted, in bytes (the protocol's).
inline constexpr std::size_t max_key_bytes = protocol::max_key_bytes;

// key_status, what is wrong with a request's Idempotency-Key header(s) if
// anything, is the protocol's (idem/protocol.hpp).

// Checks one key value (never returns absent or duplicated).
key_status check_key(std::string_view key) noexcept;
// Checks the header values as received: zero, one or several.
key_status check_key_header(const std::vector<std::string_view> &values) noexcept;
// A sentence for a problem-details "detail" member.
const char *describe(key_status s) noexcept;
// Well-formed UTF-8 as PostgreSQL accepts it (no overlongs, no surrogates,
// nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s) noexcept;

digest sha256(std::string_view bytes);
// The server's idem_key(). Throws idem::invalid_key when the server would
// refuse the key (empty, too long, NUL, invalid UTF-8).
digest cache_key(std::string_view principal, std::string_view method,
                 std::string_view target, std::string_view key);
// The server's idem_request_hash().
inline digest request_hash(std::string_view body) { return sha256(body); }

std::string to_hex(const digest &d);
// The digest as a byte string (for a bytea parameter).
inline std::string to_bytes(const digest &d)
{
    return std::string(reinterpret_cast<const char *>(d.data()), d.size());
}

} // namespace idem
