// Private to the inbox, outbox drainer and reconciler: SQL names and the
// error texts they record.
#pragma once

#include <idem/error.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace idem::detail {

// "schema.name" with the schema quoted, or the bare name (search_path).
std::string qualified(const std::string &schema, const char *name);

// what as a text the server accepts: valid UTF-8 (bad bytes become '?'),
// no NUL (libpq sends text parameters as C strings), at most max_bytes cut
// on a character boundary.
std::string error_text(std::string_view what, std::size_t max_bytes);

// The message of an exception_ptr (std::exception::what(), or a fixed text).
std::string describe(const std::exception_ptr &e);

// Refuses a schema name with a NUL byte (config_error naming the owner).
void check_schema(const std::string &schema, const char *owner);

// Milliseconds of an interval the server sent as
// (extract(epoch FROM iv) * 1000)::int8, or zero when NULL.
inline std::chrono::milliseconds millis(std::optional<std::int64_t> v)
{
    return std::chrono::milliseconds(v ? *v : 0);
}

}  // namespace idem::detail
