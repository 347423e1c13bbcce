// pg_idem C++ client: its version and the extension versions it works with.
//
// The client carries the extension's version (CMakeLists.txt reads it from
// here, and refuses to configure when extension/pg_idem.control says
// another). At its first use a runner reads the extension's version and
// refuses one older than oldest_extension (runner::check, idem::setup_error).
#pragma once

#include <string_view>

namespace idem {

inline constexpr std::string_view client_version = "0.5.0";
// 0.3.0 brought what the runner needs of the server: idem_claim and
// idem_begin with max_wait (the wait inside the server) and
// idem.after_ttl's expired outcome; older servers were only ever polled.
inline constexpr std::string_view oldest_extension = "0.3.0";

}  // namespace idem
