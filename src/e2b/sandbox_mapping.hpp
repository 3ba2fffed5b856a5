// What moat's sandbox model means in E2B's terms, for the e2b backend (e2b_backend.cpp): the
// labels it adds as metadata, the layout of an E2B sandbox, which specs E2B can honour, the
// egress a SandboxDetail reports, and whether the owner a label names is gone. Pure functions,
// no I/O but the host's name and pid table.
#pragma once

#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include "e2b_protocol/sandbox_replies.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace moat::e2b {

// Labels the backend adds as metadata (and strips from sandbox_info::labels).
inline constexpr std::string_view owner_label = "moat.owner";
inline constexpr std::string_view survive_label = "moat.survive_owner";

std::string this_host_name();
// "<host>/<pid>/<6 hex digits>": this process, told apart from an earlier one with its pid.
std::string default_owner_instance();

// Whole seconds for E2B, rounded up, at least 1.
std::int64_t seconds_up(std::chrono::milliseconds d);

// An E2B sandbox's layout: user "user", home and workdir /home/user, artifacts /home/user/out.
sandbox_layout e2b_layout();

// A spec the e2b backend can create: its TTL and limits valid, no limit E2B cannot set (unless
// best_effort), the E2B layout, printable labels none of which is the backend's own, env names
// without '=' or NUL, and an egress E2B can express (validate_network). invalid_argument,
// layer_unavailable or not_supported otherwise.
result<void> validate_spec(const sandbox_spec& spec);
// E2B filters egress by domain name (exact names and "*." wildcards, HTTP and HTTPS only) and
// by CIDR: a port, a fixed name-to-address entry or an unlocked range has no E2B form.
result<void> validate_network(const sandbox_network& n);

// The egress a SandboxDetail reports, in moat's terms (see the definition).
sandbox_network network_from(const e2b_protocol::sandbox_detail& d);

// The owner named by a moat.owner label ("<host>/<pid>/<hex>") is gone when it is on `host` and
// no process has its pid. Elsewhere it cannot be known from here.
bool owner_is_gone(std::string_view owner, const std::string& host);

}  // namespace moat::e2b
