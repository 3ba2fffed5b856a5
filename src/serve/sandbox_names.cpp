#include "serve/sandbox_names.hpp"

#include "core/ascii.hpp"

namespace moat::serve {

std::optional<sandbox_port_name> parse_sandbox_host(std::string_view host,
                                                    std::string_view domain) {
    // A domain is a DNS name (the CLI checks it): one with a ':' could not be told from a port.
    if (domain.empty() || domain.find(':') != std::string_view::npos || host.starts_with('[')) {
        return std::nullopt;
    }
    auto name = host;
    if (const auto colon = name.rfind(':'); colon != std::string_view::npos) {
        name = name.substr(0, colon);
    }
    if (name.ends_with('.')) name.remove_suffix(1);
    if (domain.ends_with('.'))
        domain.remove_suffix(1);  // a name's trailing dot is not the domain's
    if (domain.empty()) return std::nullopt;
    const auto dash = name.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto port = moat::detail::parse_port(name.substr(0, dash));
    if (!port) return std::nullopt;
    name.remove_prefix(dash + 1);
    const auto dot = name.find('.');
    if (dot == std::string_view::npos || dot == 0) return std::nullopt;
    if (!http::iequals(name.substr(dot + 1), domain)) return std::nullopt;
    const auto id = name.substr(0, dot);
    // A DNS label's characters only (sandbox ids are `sb-` and hex digits).
    for (const char c : id) {
        const bool label =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
        if (!label) return std::nullopt;
    }
    return sandbox_port_name{id, *port};
}

std::string_view sandbox_id_in_host(std::string_view host, std::string_view domain) {
    const auto named = parse_sandbox_host(host, domain);
    if (!named || named->port != envd_port) return {};
    return named->id;
}

std::optional<sandbox_port_name> requested_port(const http::request_head& head,
                                                std::string_view domain) {
    if (const auto host = head.headers.find("Host")) {
        if (const auto named = parse_sandbox_host(*host, domain)) {
            if (named->port == envd_port) return std::nullopt;
            return named;
        }
    }
    const auto port = head.headers.find("E2b-Sandbox-Port");
    if (!port) return std::nullopt;
    const auto id = head.headers.find("E2b-Sandbox-Id").value_or(std::string_view{});
    const auto number = moat::detail::parse_port(*port);
    if (number && *number == envd_port) return std::nullopt;
    return sandbox_port_name{id, number.value_or(0)};
}

std::optional<std::string> requested_sandbox_id(const http::request_head& head,
                                                std::string_view domain) {
    if (const auto header = head.headers.find("E2b-Sandbox-Id"); header && !header->empty()) {
        return std::string(*header);
    }
    if (const auto host = head.headers.find("Host")) {
        const auto id = sandbox_id_in_host(*host, domain);
        if (!id.empty()) return std::string(id);
    }
    return std::nullopt;
}

}  // namespace moat::serve
