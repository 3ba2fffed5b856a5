#include "egress/network_policy.hpp"

#include "core/ascii.hpp"

namespace moat::egress {
namespace {

constexpr std::size_t max_name_bytes = 253;
constexpr std::size_t max_label_bytes = 63;

bool name_char(char c, bool allow_underscore) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           (allow_underscore && c == '_');
}

// Why `name` (lower case) is not a valid name, or empty when it is.
std::string name_problem(std::string_view name, bool allow_underscore) {
    if (name.empty()) return "is empty";
    if (name.size() > max_name_bytes) return "is longer than 253 bytes";
    std::size_t start = 0;
    while (start <= name.size()) {
        auto dot = name.find('.', start);
        if (dot == std::string_view::npos) dot = name.size();
        const auto label = name.substr(start, dot - start);
        if (label.empty()) return "has an empty label";
        if (label.size() > max_label_bytes) return "has a label longer than 63 bytes";
        for (char c : label) {
            if (!name_char(c, allow_underscore)) {
                if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7E) {
                    return "has a control or non-ASCII byte";
                }
                return std::string("has a bad character '") + c + "'";
            }
        }
        if (label.front() == '-' || label.back() == '-') {
            return "has a label that starts or ends with '-'";
        }
        start = dot + 1;
    }
    return {};
}

std::string quoted(std::string_view text) {
    std::string out = "\"";
    for (char c : text.substr(0, 300)) {
        out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) ? '?' : c;
    }
    return out + "\"";
}

}  // namespace

bool host_pattern::matches(std::string_view host, std::uint16_t request_port) const {
    if (port) {
        if (request_port != *port) return false;
    } else if (request_port != 80 && request_port != 443) {
        return false;
    }
    if (!subdomains_only) return host == name;
    return host.size() > name.size() + 1 && host.ends_with(name) &&
           host[host.size() - name.size() - 1] == '.';
}

std::optional<std::string> normalise_host_name(std::string_view host, bool allow_underscore) {
    if (!host.empty() && host.back() == '.') host.remove_suffix(1);
    auto name = detail::ascii_lowered(host);
    if (!name_problem(name, allow_underscore).empty()) return std::nullopt;
    return name;
}

std::optional<host_pattern> parse_host_pattern(std::string_view text, std::string& why) {
    host_pattern pattern;
    if (text.starts_with('[')) {
        why = "is an IP literal; name the address with --resolve NAME=ADDR and allow the name";
        return std::nullopt;
    }
    const auto colon = text.rfind(':');
    if (colon != std::string_view::npos) {
        auto port = detail::parse_port(text.substr(colon + 1));
        if (!port) {
            why = "has a port that is not 1-65535";
            return std::nullopt;
        }
        pattern.port = port;
        text = text.substr(0, colon);
    }
    if (text.starts_with("*.")) {
        pattern.subdomains_only = true;
        text.remove_prefix(2);
    }
    if (!text.empty() && text.back() == '.') text.remove_suffix(1);
    auto name = detail::ascii_lowered(text);
    if (auto problem = name_problem(name, false); !problem.empty()) {
        why = problem;
        return std::nullopt;
    }
    if (looks_numeric(name)) {
        why = "is an IP literal; name the address with --resolve NAME=ADDR and allow the name";
        return std::nullopt;
    }
    pattern.name = std::move(name);
    return pattern;
}

bool network_policy::allows_host(std::string_view host, std::uint16_t port) const {
    if (mode_ == network_mode::all) return true;
    if (mode_ == network_mode::none) return false;
    for (const auto& pattern : patterns_) {
        if (pattern.matches(host, port)) return true;
    }
    return false;
}

const std::vector<asio::ip::address>* network_policy::pinned(std::string_view host) const {
    auto it = pinned_.find(host);
    return it == pinned_.end() ? nullptr : &it->second;
}

std::string network_policy::summary() const {
    if (mode_ == network_mode::none) return "off";
    if (mode_ == network_mode::all) return "all hosts";
    std::string out;
    for (const auto& text : pattern_texts_) {
        if (!out.empty()) out += ", ";
        out += text;
    }
    return out;
}

result<network_policy> make_network_policy(const network_request& request) {
    network_policy policy;
    policy.mode_ = request.mode;
    if (request.mode == network_mode::all && !request.allow_hosts.empty()) {
        return make_error(errc::invalid_argument,
                          "network all cannot be combined with --allow-host (it already allows "
                          "every host)");
    }
    if (request.mode == network_mode::none &&
        (!request.allow_hosts.empty() || !request.resolve.empty() ||
         !request.allow_addresses.empty())) {
        return make_error(errc::invalid_argument,
                          "network none takes no --allow-host, --resolve or --allow-address");
    }
    if (request.mode == network_mode::allow_list && request.allow_hosts.empty()) {
        return make_error(errc::invalid_argument, "an allow-list network needs --allow-host");
    }
    for (const auto& text : request.allow_hosts) {
        std::string why;
        auto pattern = parse_host_pattern(text, why);
        if (!pattern) {
            return make_error(errc::invalid_argument,
                              "--allow-host pattern " + quoted(text) + " " + why);
        }
        policy.patterns_.push_back(std::move(*pattern));
        policy.pattern_texts_.push_back(text);
    }
    for (const auto& text : request.resolve) {
        const auto equals = text.find('=');
        if (equals == std::string::npos) {
            return make_error(errc::invalid_argument,
                              "--resolve " + quoted(text) + " is not NAME=ADDR");
        }
        const std::string_view view(text);
        auto name = detail::ascii_lowered(view.substr(0, equals));
        if (!name.empty() && name.back() == '.') name.pop_back();
        if (auto problem = name_problem(name, false); !problem.empty() || looks_numeric(name)) {
            if (problem.empty()) problem = "is an IP literal";
            return make_error(errc::invalid_argument,
                              "--resolve " + quoted(text) + ": the name " + problem);
        }
        const std::string address_text(view.substr(equals + 1));
        std::error_code ec;
        auto address = asio::ip::make_address(address_text, ec);
        if (ec || address_text.find('%') != std::string::npos ||
            (address.is_v4() && address.to_string() != address_text)) {
            return make_error(errc::invalid_argument,
                              "--resolve " + quoted(text) +
                                  ": the address is not an IPv4 (dotted) or IPv6 address");
        }
        policy.pinned_[name].push_back(address);
    }
    for (const auto& text : request.allow_addresses) {
        std::string why;
        auto range = parse_address_range(text, why);
        if (!range) {
            return make_error(errc::invalid_argument,
                              "--allow-address " + quoted(text) + " " + why);
        }
        policy.ranges_.push_back(*range);
    }
    return policy;
}

result<network_policy> make_network_policy(const sandbox_network& network) {
    for (const auto* list : {&network.allow_hosts, &network.resolve, &network.allow_addresses}) {
        if (list->size() > max_network_entries) {
            return make_error(errc::invalid_argument, "network: more than " +
                                                          std::to_string(max_network_entries) +
                                                          " entries in one list");
        }
    }
    if (network.mode != network_mode::none && network.mode != network_mode::allow_list &&
        network.mode != network_mode::all) {
        return make_error(errc::invalid_argument, "network: unknown mode");
    }
    network_request request;
    request.mode = network.mode;
    request.allow_hosts = network.allow_hosts;
    request.resolve = network.resolve;
    request.allow_addresses = network.allow_addresses;
    return make_network_policy(request);
}

std::vector<std::pair<std::string, std::string>> proxy_environment(moat::network_mode mode,
                                                                   std::uint16_t port) {
    if (mode == moat::network_mode::none) return {};
    const std::string url = "http://127.0.0.1:" + std::to_string(port);
    const std::string local = "localhost,127.0.0.1,::1";
    return {{"HTTP_PROXY", url},  {"HTTPS_PROXY", url}, {"http_proxy", url},
            {"https_proxy", url}, {"NO_PROXY", local},  {"no_proxy", local}};
}

std::string describe_for_model(const sandbox_network& network) {
    const std::string through = " (HTTP and HTTPS through the proxy at http://127.0.0.1:" +
                                std::to_string(sandbox_network::proxy_port) +
                                ", already set in HTTP_PROXY and HTTPS_PROXY)";
    if (network.mode == moat::network_mode::all) return "network access to public hosts" + through;
    if (network.mode == moat::network_mode::none) return "no network access";
    std::string hosts;
    for (const auto& host : network.allow_hosts) {
        if (!hosts.empty()) hosts += ", ";
        hosts += host;
    }
    return "network access only to " + hosts + through;
}

bool reaches_pypi(const sandbox_network& network) {
    if (network.mode != moat::network_mode::allow_list)
        return network.mode == moat::network_mode::all;
    const auto policy = make_network_policy(network);
    return policy && policy->allows_host("pypi.org", 443) &&
           policy->allows_host("files.pythonhosted.org", 443);
}

std::string describe_installs_for_model(const sandbox_network& network) {
    if (network.mode == moat::network_mode::none) return {};
    if (reaches_pypi(network))
        return "pip install PKG installs from PyPI into the sandbox's Python (python, python3 and "
               "pip are one environment): the package imports at once, in the next call too.";
    return "PyPI (pypi.org, files.pythonhosted.org) is not among the allowed hosts: pip install "
           "works only from an index on them (pip install --index-url URL PKG).";
}

}  // namespace moat::egress

namespace moat {

const char* to_string(network_mode mode) noexcept {
    switch (mode) {
        case network_mode::none:
            return "none";
        case network_mode::allow_list:
            return "allow-list";
        case network_mode::all:
            return "all";
    }
    return "unknown";
}

}  // namespace moat
