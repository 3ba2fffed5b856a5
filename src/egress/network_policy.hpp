// A sandbox's network policy (pure; no I/O): none, an allow-list of host patterns, or all.
//
// A pattern is an exact name (`pypi.org`) or `*.` plus a suffix (`*.pythonhosted.org`, which
// matches subdomains only, never the bare suffix), optionally with `:PORT`; without one, ports 80
// and 443 are allowed. Names are lower-cased, one trailing dot is dropped, labels are 1-63 of
// [a-z0-9-] not starting or ending with '-', a name at most 253 bytes. An IP literal is not a
// pattern (invalid_argument): give the address a name with `--resolve NAME=ADDR` and allow the
// name, so every allowed destination is a name the operator chose.
//
// `--resolve NAME=ADDR` pins a name to an address (repeat for several; the proxy then never asks
// DNS for that name) and `--allow-address CIDR` permits a range refused by default (loopback,
// private, ...; never the metadata addresses, see address_policy.hpp). `all` allows any host but
// still refuses those addresses; it cannot be combined with a list. make_network_policy() checks
// everything and names the first bad entry in an invalid_argument error.
#pragma once

#include "egress/address_policy.hpp"

#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include <asio/ip/address.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moat::egress {

// The spec's mode (moat/sandbox_spec.hpp), one enumeration for both.
using moat::network_mode;

// What a caller asks for: the text of the flags (or of the spec's fields), unvalidated.
struct network_request {
    network_mode mode = network_mode::none;
    std::vector<std::string> allow_hosts;      // --allow-host PATTERN
    std::vector<std::string> resolve;          // --resolve NAME=ADDR
    std::vector<std::string> allow_addresses;  // --allow-address CIDR
};

struct host_pattern {
    std::string name;              // lower case, without "*." and port
    bool subdomains_only = false;  // "*." + name
    std::optional<std::uint16_t> port;
    bool matches(std::string_view host, std::uint16_t port) const;  // host already normalised
};

// "pypi.org", "*.pythonhosted.org:8443"; nullopt with `why` set ("has an empty label", ...).
std::optional<host_pattern> parse_host_pattern(std::string_view text, std::string& why);

// A host name as a request names it, normalised (lower case, no trailing dot); nullopt when it
// is not a valid DNS name by the rules above (underscores are allowed in requests, not patterns).
std::optional<std::string> normalise_host_name(std::string_view host, bool allow_underscore);

class network_policy {
  public:
    network_mode mode() const noexcept { return mode_; }
    // True when `host` (normalised) and `port` are allowed by mode and patterns.
    bool allows_host(std::string_view host, std::uint16_t port) const;
    // The pinned addresses for `host`, or nullptr when it has none.
    const std::vector<asio::ip::address>* pinned(std::string_view host) const;
    const std::vector<address_range>& allowed_ranges() const noexcept { return ranges_; }
    const std::vector<host_pattern>& patterns() const noexcept { return patterns_; }
    // "off", "all hosts", or "pypi.org, *.pythonhosted.org": for tool descriptions and logs.
    std::string summary() const;

  private:
    friend result<network_policy> make_network_policy(const network_request& request);
    network_mode mode_ = network_mode::none;
    std::vector<host_pattern> patterns_;
    std::vector<std::string> pattern_texts_;
    std::map<std::string, std::vector<asio::ip::address>, std::less<>> pinned_;
    std::vector<address_range> ranges_;
};

// Validates `request`. Errors are invalid_argument naming the flag and the bad entry, e.g.
// "--allow-host pattern \"py*pi.org\" has a bad character '*'".
result<network_policy> make_network_policy(const network_request& request);

// At most this many entries in each of a sandbox_network's lists.
inline constexpr std::size_t max_network_entries = 256;

// The same for a sandbox_spec's network field (also capped at max_network_entries per list).
result<network_policy> make_network_policy(const sandbox_network& network);

// The variables forced into every command's environment of a sandbox whose network is not none:
// HTTP_PROXY, HTTPS_PROXY, http_proxy, https_proxy = http://127.0.0.1:<port>, NO_PROXY and
// no_proxy = localhost,127.0.0.1,::1. Empty for none.
std::vector<std::pair<std::string, std::string>> proxy_environment(moat::network_mode mode,
                                                                   std::uint16_t port);

// What the network allows, for a model to read: "no network access" or "network access only to
// pypi.org, *.pythonhosted.org (HTTP and HTTPS through the proxy at http://127.0.0.1:3128)".
std::string describe_for_model(const sandbox_network& network);

// Whether pip's default index, PyPI (pypi.org and files.pythonhosted.org over HTTPS), is
// reachable: network all, or an allow-list that admits both.
bool reaches_pypi(const sandbox_network& network);

// What `pip install` can do with this network, for a model to read (docs/templates.md, "Python in
// a sandbox"); "" when the network is off (the caller says that its own way).
std::string describe_installs_for_model(const sandbox_network& network);

}  // namespace moat::egress
