// How a request names a sandbox and one of its ports on `moat serve`'s envd listener: E2B's
// per-sandbox host names (`<port>-<id>.<domain>`) and the headers the SDKs send instead when all
// envd traffic goes to one address (E2b-Sandbox-Id, E2b-Sandbox-Port). Pure functions over the
// client's bytes (fuzzed: fuzz/sandbox_names_fuzzer.cpp).
#pragma once

#include "http/message.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moat::serve {

// envd's own port: a name or header for it is an envd request, not a port request.
inline constexpr std::uint16_t envd_port = 49983;

// A sandbox and one of its ports, as a request names them.
struct sandbox_port_name {
    std::string_view id;
    std::uint16_t port = 0;
};

// The sandbox and port in a Host `<port>-<id>.<domain>[:port]` (E2B's per-sandbox names: the
// name case-insensitive, one trailing dot allowed, the port 1-65535 in decimal, the id of letters,
// digits and '-'), or nullopt: another name, another domain, an empty `domain` or id. Pure.
std::optional<sandbox_port_name> parse_sandbox_host(std::string_view host, std::string_view domain);

// The id in a Host `49983-<id>.<domain>[:port]` (envd's own port), or empty. Pure.
std::string_view sandbox_id_in_host(std::string_view host, std::string_view domain);

// The port of a sandbox a request on envd's listener is for, when it is not envd's: the Host's
// `<port>-<id>.<domain>` when it is such a name, else E2b-Sandbox-Id with E2b-Sandbox-Port (as the
// SDKs send them with E2B_SANDBOX_URL); nullopt for envd's own requests (port 49983, or no port
// named). A port header that is no port (not 1-65535 in decimal) gives port 0. Pure; views into
// `head`.
std::optional<sandbox_port_name> requested_port(const http::request_head& head,
                                                std::string_view domain);

// The sandbox id a request names: E2b-Sandbox-Id, else the Host form under `domain`; nullopt
// when it names none. Pure.
std::optional<std::string> requested_sandbox_id(const http::request_head& head,
                                                std::string_view domain);

}  // namespace moat::serve
