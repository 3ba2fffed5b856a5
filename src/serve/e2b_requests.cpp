#include "serve/e2b_requests.hpp"

#include "core/ascii.hpp"
#include "core/rfc3339.hpp"

#include <simdjson.h>

#include <ctime>

namespace moat::serve {
namespace {

error invalid(std::string detail) {
    return make_error(errc::invalid_argument, std::move(detail));
}

// The body as a JSON object (an empty or all-blank body is {} when `empty_is_object`).
struct parsed_body {
    simdjson::dom::parser parser;
    simdjson::dom::object object;
    bool empty = false;
};

result<void> parse_object(std::string_view body, parsed_body& out, bool empty_is_object) {
    if (body.size() > max_e2b_body_bytes) {
        return invalid("request body over " + std::to_string(max_e2b_body_bytes) + " bytes");
    }
    if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
        if (empty_is_object) {
            out.empty = true;
            return {};
        }
        return invalid("request body is empty: a JSON object was expected");
    }
    const simdjson::padded_string padded(body);
    simdjson::dom::element root;
    if (out.parser.parse(padded).get(root) != simdjson::SUCCESS) {
        return invalid("request body is not valid JSON");
    }
    if (root.get_object().get(out.object) != simdjson::SUCCESS) {
        return invalid("request body is not a JSON object");
    }
    return {};
}

// An integer field; absent or null: nullopt.
result<std::optional<std::int64_t>> integer_field(const parsed_body& b, const char* name) {
    if (b.empty) return std::optional<std::int64_t>();
    simdjson::dom::element e;
    if (b.object[name].get(e) != simdjson::SUCCESS || e.is_null()) {
        return std::optional<std::int64_t>();
    }
    std::int64_t n = 0;
    if (e.get_int64().get(n) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be an integer number of seconds");
    }
    return std::optional<std::int64_t>(n);
}

result<std::optional<bool>> bool_field(const parsed_body& b, const char* name) {
    simdjson::dom::element e;
    if (b.empty || b.object[name].get(e) != simdjson::SUCCESS || e.is_null()) {
        return std::optional<bool>();
    }
    bool v = false;
    if (e.get_bool().get(v) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be true or false");
    }
    return std::optional<bool>(v);
}

result<void> string_map_field(const parsed_body& b, const char* name,
                              std::map<std::string, std::string>& out) {
    simdjson::dom::element e;
    if (b.empty || b.object[name].get(e) != simdjson::SUCCESS || e.is_null()) return {};
    simdjson::dom::object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be an object of strings");
    }
    for (auto field : o) {
        std::string_view v;
        if (field.value.get_string().get(v) != simdjson::SUCCESS) {
            return invalid(std::string("'") + name + "' must be an object of strings");
        }
        if (field.key.size() > max_e2b_string_bytes || v.size() > max_e2b_string_bytes) {
            return invalid(std::string("an entry of '") + name + "' is over " +
                           std::to_string(max_e2b_string_bytes) + " bytes");
        }
        if (out.size() >= max_e2b_map_entries) {
            return invalid(std::string("'") + name + "' has more than " +
                           std::to_string(max_e2b_map_entries) + " entries");
        }
        out[std::string(field.key)] = std::string(v);
    }
    return {};
}

// network.allowOut / network.denyOut: an array of strings, capped.
result<void> string_list_field(simdjson::dom::object network, const char* name,
                               std::vector<std::string>& out) {
    simdjson::dom::element e;
    if (network[name].get(e) != simdjson::SUCCESS || e.is_null()) return {};
    simdjson::dom::array a;
    if (e.get_array().get(a) != simdjson::SUCCESS) {
        return invalid(std::string("'network.") + name + "' must be an array of strings");
    }
    for (auto item : a) {
        std::string_view v;
        if (item.get_string().get(v) != simdjson::SUCCESS) {
            return invalid(std::string("'network.") + name + "' must be an array of strings");
        }
        if (v.size() > max_e2b_network_entry_bytes) {
            return invalid(std::string("an entry of 'network.") + name + "' is over " +
                           std::to_string(max_e2b_network_entry_bytes) + " bytes");
        }
        if (out.size() >= max_e2b_network_entries) {
            return invalid(std::string("'network.") + name + "' has more than " +
                           std::to_string(max_e2b_network_entries) + " entries");
        }
        out.emplace_back(v);
    }
    return {};
}

result<std::optional<network_request>> network_field(const parsed_body& b) {
    simdjson::dom::element e;
    if (b.empty || b.object["network"].get(e) != simdjson::SUCCESS || e.is_null()) {
        return std::optional<network_request>{};
    }
    simdjson::dom::object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) return invalid("'network' must be an object");
    network_request out;
    if (auto ok = string_list_field(o, "allowOut", out.allow_out); !ok) {
        return std::move(ok).error();
    }
    if (auto ok = string_list_field(o, "denyOut", out.deny_out); !ok) {
        return std::move(ok).error();
    }
    return std::optional<network_request>(std::move(out));
}

result<void> check_timeout(std::optional<std::int64_t> t, const char* name) {
    if (t && (*t < 0 || *t > max_e2b_timeout_seconds)) {
        return invalid(std::string("'") + name + "' must be from 0 to " +
                       std::to_string(max_e2b_timeout_seconds) + " seconds");
    }
    return {};
}

constexpr std::string_view base64url_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

}  // namespace

result<create_request> parse_create_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_object(body, b, false); !ok) return std::move(ok).error();
    create_request out;
    simdjson::dom::element e;
    if (b.object["templateID"].get(e) == simdjson::SUCCESS && !e.is_null()) {
        std::string_view t;
        if (e.get_string().get(t) != simdjson::SUCCESS || t.size() > 256) {
            return invalid("'templateID' must be a string of at most 256 bytes");
        }
        out.template_id = std::string(t);
    }
    auto timeout = integer_field(b, "timeout");
    if (!timeout) return std::move(timeout).error();
    if (auto ok = check_timeout(*timeout, "timeout"); !ok) return std::move(ok).error();
    out.timeout_s = *timeout;
    if (auto ok = string_map_field(b, "metadata", out.metadata); !ok) return std::move(ok).error();
    if (auto ok = string_map_field(b, "envVars", out.env_vars); !ok) return std::move(ok).error();
    auto auto_pause = bool_field(b, "autoPause");
    if (!auto_pause) return std::move(auto_pause).error();
    out.auto_pause = auto_pause->value_or(false);
    auto secure = bool_field(b, "secure");
    if (!secure) return std::move(secure).error();
    out.secure = *secure;
    auto internet = bool_field(b, "allow_internet_access");
    if (!internet) return std::move(internet).error();
    out.allow_internet_access = *internet;
    auto network = network_field(b);
    if (!network) return std::move(network).error();
    out.network = std::move(*network);
    return out;
}

result<std::int64_t> parse_timeout_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_object(body, b, false); !ok) return std::move(ok).error();
    auto timeout = integer_field(b, "timeout");
    if (!timeout) return std::move(timeout).error();
    if (!*timeout) return invalid("'timeout' is required");
    if (auto ok = check_timeout(*timeout, "timeout"); !ok) return std::move(ok).error();
    return **timeout;
}

result<std::optional<std::int64_t>> parse_connect_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_object(body, b, true); !ok) return std::move(ok).error();
    auto timeout = integer_field(b, "timeout");
    if (!timeout) return std::move(timeout).error();
    if (auto ok = check_timeout(*timeout, "timeout"); !ok) return std::move(ok).error();
    return *timeout;
}

result<std::optional<std::int64_t>> parse_refresh_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_object(body, b, true); !ok) return std::move(ok).error();
    auto duration = integer_field(b, "duration");
    if (!duration) return std::move(duration).error();
    if (*duration && (**duration < 0 || **duration > 3600)) {
        return invalid("'duration' must be from 0 to 3600 seconds");
    }
    return *duration;
}

result<std::string> query_unescape(std::string_view text) {
    auto decoded = detail::percent_decoded(text, true);
    if (!decoded) return invalid("malformed percent-escape in the query");
    return std::move(*decoded);
}

result<std::map<std::string, std::string>> parse_query(std::string_view query) {
    std::map<std::string, std::string> out;
    while (!query.empty()) {
        const auto amp = query.find('&');
        const auto pair = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
        if (pair.empty()) continue;
        const auto eq = pair.find('=');
        auto name = query_unescape(pair.substr(0, eq));
        if (!name) return std::move(name).error();
        std::string_view raw_value;
        if (eq != std::string_view::npos) raw_value = pair.substr(eq + 1);
        auto value = query_unescape(raw_value);
        if (!value) return std::move(value).error();
        out.emplace(std::move(*name), std::move(*value));
    }
    return out;
}

result<std::vector<std::pair<std::string, std::string>>> parse_metadata_filter(
    std::string_view value) {
    if (value.size() > max_e2b_body_bytes) return invalid("'metadata' filter too long");
    auto decoded = query_unescape(value);
    if (!decoded) return invalid("Error parsing metadata: malformed percent-escape");
    std::vector<std::pair<std::string, std::string>> out;
    std::string_view rest = *decoded;
    while (!rest.empty()) {
        const auto amp = rest.find('&');
        const auto pair = rest.substr(0, amp);
        rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
        const auto eq = pair.find('=');
        if (eq == std::string_view::npos || pair.find('=', eq + 1) != std::string_view::npos) {
            return invalid("Error parsing metadata: expected key=value pairs joined by '&'");
        }
        auto key = query_unescape(pair.substr(0, eq));
        auto val = query_unescape(pair.substr(eq + 1));
        if (!key || !val) return invalid("Error parsing metadata: malformed percent-escape");
        if (out.size() >= max_e2b_map_entries)
            return invalid("'metadata' filter has too many pairs");
        out.emplace_back(std::move(*key), std::move(*val));
    }
    return out;
}

result<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view s) {
    auto point = detail::parse_rfc3339(s);
    if (!point) return invalid("not an RFC 3339 date-time from 1970 to 2200");
    return *point;
}

std::string format_rfc3339(std::chrono::system_clock::time_point t) {
    return detail::format_rfc3339(t, 3);
}

std::string base64url_encode(std::string_view bytes) {
    std::string out;
    std::uint32_t buffer = 0;
    int bits = 0;
    for (const unsigned char c : bytes) {
        buffer = (buffer << 8) | c;
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out.push_back(base64url_alphabet[(buffer >> bits) & 0x3f]);
        }
    }
    if (bits > 0) out.push_back(base64url_alphabet[(buffer << (6 - bits)) & 0x3f]);
    return out;
}

std::optional<std::string> base64url_decode(std::string_view text) {
    std::string out;
    std::uint32_t buffer = 0;
    int bits = 0;
    for (const char c : text) {
        const auto index = base64url_alphabet.find(c);
        if (index == std::string_view::npos) return std::nullopt;
        buffer = (buffer << 6) | static_cast<std::uint32_t>(index);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((buffer >> bits) & 0xff));
        }
    }
    return out;
}

}  // namespace moat::serve
