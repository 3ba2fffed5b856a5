#include "e2b/sandbox_mapping.hpp"

#include "e2b_protocol/network_names.hpp"
#include "egress/address_policy.hpp"
#include "egress/network_policy.hpp"
#include "local/spec_validation.hpp"

#include <sys/random.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>

namespace moat::e2b {
namespace {

bool is_reserved_label(std::string_view key) {
    return key == owner_label || key == survive_label;
}

// An explicit limit E2B cannot express (templates fix a sandbox's resources), or "".
std::string inexpressible_limit(const resource_limits& l) {
    if (l.memory_bytes) return "memory_bytes";
    if (l.pids) return "pids";
    if (l.cpu_millicores) return "cpu_millicores";
    if (l.workspace_bytes) return "workspace_bytes";
    if (l.tmp_bytes) return "tmp_bytes";
    if (l.open_files) return "open_files";
    return "";
}

bool is_printable(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

}  // namespace

std::string this_host_name() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

std::string default_owner_instance() {
    std::uint32_t random = 0;
    if (::getrandom(&random, sizeof random, GRND_NONBLOCK) != sizeof random) {
        random =
            static_cast<std::uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%06x", static_cast<unsigned>(random & 0xffffff));
    return this_host_name() + "/" + std::to_string(::getpid()) + "/" + hex;
}

// Whole seconds for E2B, rounded up, at least 1.
std::int64_t seconds_up(std::chrono::milliseconds d) {
    return std::max<std::int64_t>(1, (d.count() + 999) / 1000);
}

sandbox_layout e2b_layout() {
    sandbox_layout l;
    l.user = "user";
    l.home = "/home/user";
    l.workdir = "/home/user";
    l.artifacts_dir = "/home/user/out";
    return l;
}

result<void> validate_spec(const sandbox_spec& spec) {
    if (auto ttl = validate_ttl(spec.ttl); !ttl) return ttl;
    if (auto limits = validate_limits(spec.limits); !limits) return limits;
    const auto limit = inexpressible_limit(spec.limits);
    if (!limit.empty() && !spec.best_effort) {
        return make_error(errc::layer_unavailable,
                          "limits." + limit +
                              ": the e2b backend cannot set it per sandbox (the template "
                              "fixes a sandbox's resources); leave it unset or set best_effort");
    }
    if (spec.layout != sandbox_layout{} && spec.layout != e2b_layout()) {
        return make_error(errc::invalid_argument,
                          "layout: the e2b backend's sandboxes run as 'user' with home and "
                          "workdir /home/user and artifacts in /home/user/out");
    }
    for (const auto& [key, value] : spec.labels) {
        if (key.empty() || !is_printable(key) || !is_printable(value)) {
            return make_error(errc::invalid_argument, "labels: keys and values must be printable");
        }
        if (is_reserved_label(key)) {
            return make_error(errc::invalid_argument,
                              "labels: '" + key + "' is the e2b backend's own label");
        }
    }
    for (const auto& [key, value] : spec.env) {
        if (key.empty() || key.find('=') != std::string::npos ||
            key.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
            return make_error(errc::invalid_argument, "env: a name is empty or has '=' or NUL");
        }
    }
    if (auto ok = validate_network(spec.network); !ok) return ok;
    return {};
}

// E2B filters egress by domain name (exact names and "*." wildcards, HTTP and HTTPS only)
// and by CIDR: a port, a fixed name-to-address entry or an unlocked range has no E2B form.
result<void> validate_network(const sandbox_network& n) {
    if (n.mode == network_mode::all && !n.allow_hosts.empty()) {
        return make_error(errc::invalid_argument, "network all with an allow-list: choose one");
    }
    if (n.mode == network_mode::allow_list && n.allow_hosts.empty()) {
        return make_error(errc::invalid_argument, "network allow-list: the list is empty");
    }
    for (const auto& host : n.allow_hosts) {
        if (auto valid = e2b_protocol::check_allow_out_name(host); !valid) {
            auto e = std::move(valid).error();
            e.detail = "network allow-list " + e.detail;
            return e;
        }
    }
    if (!n.resolve.empty()) {
        return make_error(errc::not_supported,
                          "network resolve '" + n.resolve.front() +
                              "': the e2b backend cannot pin a name to an address");
    }
    if (!n.allow_addresses.empty()) {
        return make_error(errc::not_supported,
                          "network allow_address '" + n.allow_addresses.front() +
                              "': the e2b backend cannot unlock an address range");
    }
    return {};
}

// The egress a SandboxDetail reports, in moat's terms. The switch off, or every address denied
// (denyOut 0.0.0.0/0), leaves what allowOut lets past: its names (allow_hosts) and its address
// entries (allow_addresses), an allow-list, or none when it lists nothing. The switch on (or
// absent: E2B's default) without that deny is all; moat has no "all but some ranges", and the
// wider answer is the one a caller may rely on.
sandbox_network network_from(const e2b_protocol::sandbox_detail& d) {
    sandbox_network n;
    const bool denies_all =
        d.allow_internet_access == false ||
        std::find(d.deny_out.begin(), d.deny_out.end(), "0.0.0.0/0") != d.deny_out.end();
    if (!denies_all) {
        n.mode = network_mode::all;
        return n;
    }
    for (const auto& entry : d.allow_out) {
        (egress::is_address_entry(entry) ? n.allow_addresses : n.allow_hosts).push_back(entry);
    }
    if (!n.allow_hosts.empty() || !n.allow_addresses.empty()) n.mode = network_mode::allow_list;
    return n;
}

// The owner named by a moat.owner label ("<host>/<pid>/<hex>") is gone when it is on this
// host and no process has its pid. Elsewhere it cannot be known from here: its heartbeat
// ends the sandbox within heartbeat_timeout of the owner's end.
bool owner_is_gone(std::string_view owner, const std::string& host) {
    const auto slash = owner.find('/');
    if (slash == std::string_view::npos || owner.substr(0, slash) != host) return false;
    const auto rest = owner.substr(slash + 1);
    const auto end = rest.find('/');
    const auto digits = rest.substr(0, end);
    int pid = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (ec != std::errc() || ptr != digits.data() + digits.size() || pid <= 0) return false;
    return ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace moat::e2b
