#include "e2b_protocol/sandbox_requests.hpp"

#include "core/ascii.hpp"
#include "core/json_writer.hpp"
#include "core/rfc3339.hpp"
#include "e2b_protocol/json_fields.hpp"

#include <algorithm>
#include <charconv>

namespace moat::e2b_protocol {
namespace {

using detail::field;

error invalid(std::string detail) {
    return make_error(errc::invalid_argument, std::move(detail));
}

// The body as a JSON object (an empty or all-blank body is {} when `empty_is_object`).
struct parsed_body {
    simdjson::dom::parser parser;
    simdjson::dom::object object;
    bool empty = false;

    std::optional<simdjson::dom::element> get(const char* name) const {
        if (empty) return std::nullopt;
        return field(object, name);
    }
};

result<void> parse_body(std::string_view body, parsed_body& out, bool empty_is_object) {
    if (body.size() > max_request_body_bytes) {
        return invalid("request body over " + std::to_string(max_request_body_bytes) + " bytes");
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
    const auto e = b.get(name);
    if (!e) return std::optional<std::int64_t>();
    std::int64_t n = 0;
    if (e->get_int64().get(n) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be an integer number of seconds");
    }
    return std::optional<std::int64_t>(n);
}

result<std::optional<bool>> bool_field(const parsed_body& b, const char* name) {
    const auto e = b.get(name);
    if (!e) return std::optional<bool>();
    bool v = false;
    if (e->get_bool().get(v) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be true or false");
    }
    return std::optional<bool>(v);
}

result<void> string_map_field(const parsed_body& b, const char* name,
                              std::map<std::string, std::string>& out) {
    const auto e = b.get(name);
    if (!e) return {};
    simdjson::dom::object o;
    if (e->get_object().get(o) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be an object of strings");
    }
    for (auto entry : o) {
        std::string_view v;
        if (entry.value.get_string().get(v) != simdjson::SUCCESS) {
            return invalid(std::string("'") + name + "' must be an object of strings");
        }
        if (entry.key.size() > max_string_bytes || v.size() > max_string_bytes) {
            return invalid(std::string("an entry of '") + name + "' is over " +
                           std::to_string(max_string_bytes) + " bytes");
        }
        if (out.size() >= max_map_entries) {
            return invalid(std::string("'") + name + "' has more than " +
                           std::to_string(max_map_entries) + " entries");
        }
        out[std::string(entry.key)] = std::string(v);
    }
    return {};
}

// network.allowOut / network.denyOut: an array of strings, capped.
result<void> string_list_field(simdjson::dom::object network, const char* name,
                               std::vector<std::string>& out) {
    const auto e = field(network, name);
    if (!e) return {};
    simdjson::dom::array a;
    const std::string what = std::string("'network.") + name + "'";
    if (e->get_array().get(a) != simdjson::SUCCESS) {
        return invalid(what + " must be an array of strings");
    }
    for (auto item : a) {
        std::string_view v;
        if (item.get_string().get(v) != simdjson::SUCCESS) {
            return invalid(what + " must be an array of strings");
        }
        if (v.size() > max_network_entry_bytes) {
            return invalid("an entry of " + what + " is over " +
                           std::to_string(max_network_entry_bytes) + " bytes");
        }
        if (out.size() >= max_network_entries) {
            return invalid(what + " has more than " + std::to_string(max_network_entries) +
                           " entries");
        }
        out.emplace_back(v);
    }
    return {};
}

result<std::optional<network_request>> network_field(const parsed_body& b) {
    const auto e = b.get("network");
    if (!e) return std::optional<network_request>{};
    simdjson::dom::object o;
    if (e->get_object().get(o) != simdjson::SUCCESS) return invalid("'network' must be an object");
    network_request out;
    if (auto ok = string_list_field(o, "allowOut", out.allow_out); !ok) {
        return std::move(ok).error();
    }
    if (auto ok = string_list_field(o, "denyOut", out.deny_out); !ok) {
        return std::move(ok).error();
    }
    if (const auto traffic = field(o, "allowPublicTraffic")) {
        bool v = false;
        if (traffic->get_bool().get(v) != simdjson::SUCCESS) {
            return invalid("'network.allowPublicTraffic' must be true or false");
        }
        out.allow_public_traffic = v;
    }
    if (const auto mask = field(o, "maskRequestHost")) {
        std::string_view v;
        if (mask->get_string().get(v) != simdjson::SUCCESS || v.empty() ||
            v.size() > max_mask_request_host ||
            std::any_of(v.begin(), v.end(), [](char c) { return c <= ' ' || c > '~'; })) {
            return invalid("'network.maskRequestHost' must be a host name of 1 to " +
                           std::to_string(max_mask_request_host) +
                           " visible ASCII characters (\"${PORT}\" stands for the port)");
        }
        out.mask_request_host = std::string(v);
    }
    return std::optional<network_request>(std::move(out));
}

// autoResume: {"enabled": bool} (SandboxAutoResumeConfig).
result<std::optional<bool>> auto_resume_field(const parsed_body& b) {
    const auto e = b.get("autoResume");
    if (!e) return std::optional<bool>();
    simdjson::dom::object o;
    bool enabled = false;
    const auto flag =
        e->get_object().get(o) == simdjson::SUCCESS ? field(o, "enabled") : std::nullopt;
    if (!flag || flag->get_bool().get(enabled) != simdjson::SUCCESS) {
        return invalid("'autoResume' must be {\"enabled\": true or false}");
    }
    return std::optional<bool>(enabled);
}

// An optional whole number of seconds from 0 to `max`.
result<std::optional<std::int64_t>> seconds_field(const parsed_body& b, const char* name,
                                                  std::int64_t max) {
    auto seconds = integer_field(b, name);
    if (!seconds) return seconds;
    if (*seconds && (**seconds < 0 || **seconds > max)) {
        return invalid(std::string("'") + name + "' must be from 0 to " + std::to_string(max) +
                       " seconds");
    }
    return seconds;
}

// A body of one optional seconds field (an empty body is {}).
result<std::optional<std::int64_t>> optional_seconds_body(std::string_view body, const char* name,
                                                          std::int64_t max) {
    parsed_body b;
    if (auto ok = parse_body(body, b, true); !ok) return std::move(ok).error();
    return seconds_field(b, name, max);
}

void write_string_map(json_writer& w, std::string_view name,
                      const std::map<std::string, std::string>& map) {
    w.key(name).begin_object();
    for (const auto& [k, v] : map) w.key(k).value(v);
    w.end_object();
}

void write_string_list(json_writer& w, std::string_view name,
                       const std::vector<std::string>& list) {
    w.key(name).begin_array();
    for (const auto& item : list) w.value(item);
    w.end_array();
}

// {"<name>": s}, or {} when unset.
std::string seconds_body(const char* name, std::optional<std::int64_t> seconds) {
    json_writer w;
    w.begin_object();
    if (seconds) w.key(name).value(*seconds);
    w.end_object();
    return w.take();
}

// Splits `text` at the first `separator`: the part before it, and `text` left after it.
std::string_view take_until(std::string_view& text, char separator) {
    const auto at = text.find(separator);
    const auto part = text.substr(0, at);
    text = at == std::string_view::npos ? std::string_view() : text.substr(at + 1);
    return part;
}

}  // namespace

bool is_valid_sandbox_id(std::string_view id) noexcept {
    if (id.empty() || id.size() > 64 || id.front() == '-' || id.back() == '-') return false;
    for (const char c : id) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    return true;
}

std::string encode_create_request(const create_request& r) {
    json_writer w;
    w.begin_object();
    w.key("templateID").value(r.template_id);
    if (r.timeout_s) w.key("timeout").value(*r.timeout_s);
    write_string_map(w, "metadata", r.metadata);
    write_string_map(w, "envVars", r.env_vars);
    if (r.auto_pause) w.key("autoPause").value(true);
    if (r.auto_resume)
        w.key("autoResume").begin_object().key("enabled").value(*r.auto_resume).end_object();
    if (r.allow_internet_access) w.key("allow_internet_access").value(*r.allow_internet_access);
    if (r.network) {
        w.key("network").begin_object();
        write_string_list(w, "allowOut", r.network->allow_out);
        write_string_list(w, "denyOut", r.network->deny_out);
        if (r.network->allow_public_traffic) {
            w.key("allowPublicTraffic").value(*r.network->allow_public_traffic);
        }
        if (r.network->mask_request_host) {
            w.key("maskRequestHost").value(*r.network->mask_request_host);
        }
        w.end_object();
    }
    if (r.secure) w.key("secure").value(*r.secure);
    w.end_object();
    return w.take();
}

result<create_request> parse_create_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_body(body, b, false); !ok) return std::move(ok).error();
    create_request out;
    if (const auto e = b.get("templateID")) {
        std::string_view t;
        if (e->get_string().get(t) != simdjson::SUCCESS || t.size() > 256) {
            return invalid("'templateID' must be a string of at most 256 bytes");
        }
        out.template_id = std::string(t);
    }
    auto timeout = seconds_field(b, "timeout", max_timeout_seconds);
    if (!timeout) return std::move(timeout).error();
    out.timeout_s = *timeout;
    if (auto ok = string_map_field(b, "metadata", out.metadata); !ok) return std::move(ok).error();
    if (auto ok = string_map_field(b, "envVars", out.env_vars); !ok) return std::move(ok).error();
    auto auto_pause = bool_field(b, "autoPause");
    if (!auto_pause) return std::move(auto_pause).error();
    out.auto_pause = auto_pause->value_or(false);
    auto auto_resume = auto_resume_field(b);
    if (!auto_resume) return std::move(auto_resume).error();
    out.auto_resume = *auto_resume;
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

std::string encode_network_update_request(const network_update_request& r) {
    json_writer w;
    w.begin_object();
    if (!r.network.allow_out.empty()) write_string_list(w, "allowOut", r.network.allow_out);
    if (!r.network.deny_out.empty()) write_string_list(w, "denyOut", r.network.deny_out);
    if (r.allow_internet_access) w.key("allow_internet_access").value(*r.allow_internet_access);
    w.end_object();
    return w.take();
}

result<network_update_request> parse_network_update_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_body(body, b, false); !ok) return std::move(ok).error();
    network_update_request out;
    if (auto ok = string_list_field(b.object, "allowOut", out.network.allow_out); !ok) {
        return std::move(ok).error();
    }
    if (auto ok = string_list_field(b.object, "denyOut", out.network.deny_out); !ok) {
        return std::move(ok).error();
    }
    auto internet = bool_field(b, "allow_internet_access");
    if (!internet) return std::move(internet).error();
    out.allow_internet_access = *internet;
    return out;
}

std::string encode_timeout_request(std::int64_t timeout_s) {
    return seconds_body("timeout", timeout_s);
}

result<std::int64_t> parse_timeout_request(std::string_view body) {
    parsed_body b;
    if (auto ok = parse_body(body, b, false); !ok) return std::move(ok).error();
    auto timeout = seconds_field(b, "timeout", max_timeout_seconds);
    if (!timeout) return std::move(timeout).error();
    if (!*timeout) return invalid("'timeout' is required");
    return **timeout;
}

std::string encode_connect_request(std::optional<std::int64_t> timeout_s) {
    return seconds_body("timeout", timeout_s);
}

result<std::optional<std::int64_t>> parse_connect_request(std::string_view body) {
    return optional_seconds_body(body, "timeout", max_timeout_seconds);
}

std::string encode_refresh_request(std::optional<std::int64_t> duration_s) {
    return seconds_body("duration", duration_s);
}

result<std::optional<std::int64_t>> parse_refresh_request(std::string_view body) {
    return optional_seconds_body(body, "duration", max_refresh_seconds);
}

result<std::string> query_unescape(std::string_view text) {
    auto decoded = moat::detail::percent_decoded(text, true);
    if (!decoded) return invalid("malformed percent-escape in the query");
    return std::move(*decoded);
}

result<std::map<std::string, std::string>> parse_query(std::string_view query) {
    std::map<std::string, std::string> out;
    while (!query.empty()) {
        const auto pair = take_until(query, '&');
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

std::string encode_metadata_filter(const std::map<std::string, std::string>& filter) {
    using moat::detail::percent_encoded;
    std::string pairs;
    for (const auto& [key, value] : filter) {
        if (!pairs.empty()) pairs += '&';
        // Twice here: the server unescapes the whole value before it splits it (see the header).
        pairs += percent_encoded(percent_encoded(key));
        pairs += '=';
        pairs += percent_encoded(percent_encoded(value));
    }
    return percent_encoded(pairs);
}

result<std::vector<std::pair<std::string, std::string>>> parse_metadata_filter(
    std::string_view value) {
    if (value.size() > max_request_body_bytes) return invalid("'metadata' filter too long");
    auto decoded = query_unescape(value);
    if (!decoded) return invalid("Error parsing metadata: malformed percent-escape");
    std::vector<std::pair<std::string, std::string>> out;
    std::string_view rest = *decoded;
    while (!rest.empty()) {
        const auto pair = take_until(rest, '&');
        const auto eq = pair.find('=');
        if (eq == std::string_view::npos || pair.find('=', eq + 1) != std::string_view::npos) {
            return invalid("Error parsing metadata: expected key=value pairs joined by '&'");
        }
        auto key = query_unescape(pair.substr(0, eq));
        auto val = query_unescape(pair.substr(eq + 1));
        if (!key || !val) return invalid("Error parsing metadata: malformed percent-escape");
        if (out.size() >= max_map_entries) return invalid("'metadata' filter has too many pairs");
        out.emplace_back(std::move(*key), std::move(*val));
    }
    return out;
}

std::string encode_list_request(const list_request& r) {
    using moat::detail::percent_encoded;
    std::string out;
    const auto add = [&out](std::string_view name, std::string_view encoded) {
        if (!out.empty()) out += '&';
        out.append(name).append("=").append(encoded);
    };
    if (!r.metadata.empty()) {
        const std::map<std::string, std::string> filter(r.metadata.begin(), r.metadata.end());
        add("metadata", encode_metadata_filter(filter));
    }
    if (!r.state.empty()) add("state", percent_encoded(r.state));
    if (!r.order.empty()) add("order", percent_encoded(r.order));
    if (r.limit) add("limit", std::to_string(*r.limit));
    if (!r.template_id.empty()) add("template", percent_encoded(r.template_id));
    if (r.started_after) add("startedAfter", percent_encoded(format_rfc3339(*r.started_after)));
    if (!r.next_token.empty()) add("nextToken", percent_encoded(r.next_token));
    return out;
}

result<list_request> parse_list_request(std::string_view raw, bool paged) {
    auto query = parse_query(raw);
    if (!query) return std::move(query).error();
    list_request q;
    const auto get = [&](const char* name) -> const std::string* {
        const auto it = query->find(name);
        return it == query->end() || it->second.empty() ? nullptr : &it->second;
    };
    if (const auto* m = get("metadata")) {
        auto filter = parse_metadata_filter(*m);
        if (!filter) return std::move(filter).error();
        q.metadata = std::move(*filter);
    }
    if (!paged) return q;
    if (const auto* st = get("state")) {
        std::string_view rest = *st;
        while (!rest.empty()) {
            const auto one = take_until(rest, ',');
            if (one != "running" && one != "paused") {
                return invalid("state '" + std::string(one) + "' is not running or paused");
            }
        }
        q.state = *st;
    }
    if (const auto* order = get("order")) {
        if (*order != "asc" && *order != "desc") return invalid("order must be asc or desc");
        q.order = *order;
    }
    if (const auto* limit = get("limit")) {
        long long n = 0;
        const auto* end = limit->data() + limit->size();
        const auto [ptr, ec] = std::from_chars(limit->data(), end, n);
        if (ec != std::errc() || ptr != end) return invalid("limit must be a number");
        q.limit = static_cast<std::size_t>(std::clamp<long long>(n, 1, 100));
    }
    if (const auto it = query->find("template"); it != query->end()) q.template_id = it->second;
    if (const auto* after = get("startedAfter")) {
        auto point = parse_rfc3339(*after);
        if (!point) return invalid("startedAfter: " + point.error().detail);
        q.started_after = *point;
    }
    if (const auto* token = get("nextToken")) q.next_token = *token;
    return q;
}

result<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text) {
    auto point = moat::detail::parse_rfc3339(text);
    if (!point) return invalid("not an RFC 3339 date-time from 1970 to 2200");
    return *point;
}

std::string format_rfc3339(std::chrono::system_clock::time_point t) {
    return moat::detail::format_rfc3339(t, 3);
}

}  // namespace moat::e2b_protocol
