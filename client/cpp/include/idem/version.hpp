// pg_idem C++ client: its version and the extension versions it works with.
//
// The client carries the extension's version (CMakeLists.txt reads it from
// here, and refuses to configure when extension/pg_idem.control says
// another). At its first use a runner reads the extension's version and
// refuses one older than oldest_extension (runner::check, idem::setup_error).
#pragma once

#include <idem/protocol.hpp>

#include <string_view>

namespace idem {

inline constexpr std::string_view client_version = "0.6.0";
// The protocol's, the same for the three clients (protocol.toml says why
// it is that one).
inline constexpr std::string_view oldest_extension = protocol::oldest_extension;

}  // namespace idem
