#include "e2b/e2b_responses.hpp"

#include "core/rfc3339.hpp"

#include <simdjson.h>

#include <charconv>
#include <ctime>

namespace moat::e2b {
namespace {

error bad(std::string what) {
    return make_error(errc::protocol_error, "the E2B control plane sent " + std::move(what));
}

result<simdjson::dom::element> parse_root(simdjson::dom::parser& parser, std::string_view body,
                                          std::size_t cap, const char* what) {
    if (body.size() > cap) {
        return bad(std::string(what) + " over " + std::to_string(cap) + " bytes");
    }
    const simdjson::padded_string padded(body);
    simdjson::dom::element root;
    if (parser.parse(padded).get(root) != simdjson::SUCCESS) {
        return bad(std::string(what) + " that is not valid JSON");
    }
    return root;
}

// A string field: absent or null gives "" unless required.
result<std::string> string_field(simdjson::dom::object o, const char* name, bool required,
                                 const char* what) {
    simdjson::dom::element e;
    if (o[name].get(e) != simdjson::SUCCESS || e.is_null()) {
        if (required) return bad(std::string(what) + " without '" + name + "'");
        return std::string();
    }
    std::string_view v;
    if (e.get_string().get(v) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose '" + name + "' is not a string");
    }
    if (v.size() > max_string_bytes) {
        return bad(std::string(what) + " whose '" + name + "' is over " +
                   std::to_string(max_string_bytes) + " bytes");
    }
    return std::string(v);
}

// An integer field, as a number or a decimal string; absent or null: 0.
result<std::int64_t> integer_field(simdjson::dom::object o, const char* name, const char* what) {
    simdjson::dom::element e;
    if (o[name].get(e) != simdjson::SUCCESS || e.is_null()) return std::int64_t{0};
    std::int64_t n = 0;
    if (e.get_int64().get(n) == simdjson::SUCCESS) return n;
    std::string_view s;
    if (e.get_string().get(s) == simdjson::SUCCESS) {
        const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
        if (ec == std::errc() && ptr == s.data() + s.size()) return n;
    }
    return bad(std::string(what) + " whose '" + name + "' is not an integer");
}

result<std::chrono::system_clock::time_point> time_field(simdjson::dom::object o, const char* name,
                                                         const char* what) {
    auto text = string_field(o, name, true, what);
    if (!text) return std::move(text).error();
    auto t = parse_timestamp(*text);
    if (!t) return bad(std::string(what) + " whose '" + name + "' is not an RFC 3339 date-time");
    return *t;
}

result<void> metadata_field(simdjson::dom::object o, std::map<std::string, std::string>& out,
                            const char* what) {
    simdjson::dom::element e;
    if (o["metadata"].get(e) != simdjson::SUCCESS || e.is_null()) return {};
    simdjson::dom::object m;
    if (e.get_object().get(m) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose 'metadata' is not an object");
    }
    for (auto field : m) {
        std::string_view v;
        if (field.value.get_string().get(v) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'metadata' has a value that is not a string");
        }
        if (field.key.size() > max_string_bytes || v.size() > max_string_bytes) {
            return bad(std::string(what) + " with a metadata entry over " +
                       std::to_string(max_string_bytes) + " bytes");
        }
        if (out.size() >= max_metadata_entries) {
            return bad(std::string(what) + " with more than " +
                       std::to_string(max_metadata_entries) + " metadata entries");
        }
        out[std::string(field.key)] = std::string(v);
    }
    return {};
}

// One of network.allowOut / network.denyOut: absent or null gives none.
result<void> network_list_field(simdjson::dom::object network, const char* name,
                                std::vector<std::string>& out, const char* what) {
    simdjson::dom::element e;
    if (network[name].get(e) != simdjson::SUCCESS || e.is_null()) return {};
    simdjson::dom::array items;
    if (e.get_array().get(items) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose 'network." + name + "' is not an array");
    }
    for (auto item : items) {
        std::string_view v;
        if (item.get_string().get(v) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'network." + name +
                       "' has an entry that is not a string");
        }
        if (v.size() > max_string_bytes) {
            return bad(std::string(what) + " whose 'network." + name + "' has an entry over " +
                       std::to_string(max_string_bytes) + " bytes");
        }
        if (out.size() >= max_network_entries) {
            return bad(std::string(what) + " whose 'network." + name + "' has more than " +
                       std::to_string(max_network_entries) + " entries");
        }
        out.emplace_back(v);
    }
    return {};
}

// allowInternetAccess and the network object of a SandboxDetail.
result<void> network_fields(simdjson::dom::object o, sandbox_detail& d, const char* what) {
    simdjson::dom::element e;
    if (o["allowInternetAccess"].get(e) == simdjson::SUCCESS && !e.is_null()) {
        bool on = false;
        if (e.get_bool().get(on) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'allowInternetAccess' is not a boolean");
        }
        d.allow_internet_access = on;
    }
    if (o["network"].get(e) != simdjson::SUCCESS || e.is_null()) return {};
    simdjson::dom::object network;
    if (e.get_object().get(network) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose 'network' is not an object");
    }
    if (auto ok = network_list_field(network, "allowOut", d.allow_out, what); !ok) return ok;
    return network_list_field(network, "denyOut", d.deny_out, what);
}

result<sandbox_detail> detail_from(simdjson::dom::element element, const char* what) {
    simdjson::dom::object o;
    if (element.get_object().get(o) != simdjson::SUCCESS) {
        return bad(std::string(what) + " that is not a JSON object");
    }
    sandbox_detail d;
    auto id = string_field(o, "sandboxID", true, what);
    if (!id) return std::move(id).error();
    if (!is_valid_sandbox_id(*id)) return bad(std::string(what) + " with an invalid 'sandboxID'");
    d.sandbox_id = std::move(*id);
    for (auto [name, target] :
         {std::pair{"templateID", &d.template_id}, std::pair{"alias", &d.alias},
          std::pair{"state", &d.state}, std::pair{"envdAccessToken", &d.envd_access_token},
          std::pair{"domain", &d.domain}}) {
        auto v = string_field(o, name, false, what);
        if (!v) return std::move(v).error();
        *target = std::move(*v);
    }
    auto started = time_field(o, "startedAt", what);
    if (!started) return std::move(started).error();
    d.started_at = *started;
    auto ends = time_field(o, "endAt", what);
    if (!ends) return std::move(ends).error();
    d.end_at = *ends;
    for (auto [name, target] :
         {std::pair{"cpuCount", &d.cpu_count}, std::pair{"memoryMB", &d.memory_mb},
          std::pair{"diskSizeMB", &d.disk_size_mb}}) {
        auto v = integer_field(o, name, what);
        if (!v) return std::move(v).error();
        *target = *v;
    }
    auto metadata = metadata_field(o, d.metadata, what);
    if (!metadata) return std::move(metadata).error();
    if (auto network = network_fields(o, d, what); !network) return std::move(network).error();
    return d;
}

error not_timestamp() {
    return make_error(errc::protocol_error, "not an RFC 3339 date-time");
}

// Percent-encoding of everything but RFC 3986's unreserved characters.
std::string escape_component(std::string_view text) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        const bool unreserved = (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') ||
                                (u >= '0' && u <= '9') || u == '-' || u == '.' || u == '_' ||
                                u == '~';
        if (unreserved) {
            out += c;
        } else {
            out += '%';
            out += hex[u >> 4];
            out += hex[u & 15];
        }
    }
    return out;
}

}  // namespace

result<sandbox_reply> parse_sandbox_reply(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_root(parser, body, max_sandbox_body_bytes, "a Sandbox");
    if (!root) return std::move(root).error();
    simdjson::dom::object o;
    if (root->get_object().get(o) != simdjson::SUCCESS) {
        return bad("a Sandbox that is not a JSON object");
    }
    sandbox_reply r;
    auto id = string_field(o, "sandboxID", true, "a Sandbox");
    if (!id) return std::move(id).error();
    if (!is_valid_sandbox_id(*id)) return bad("a Sandbox with an invalid 'sandboxID'");
    r.sandbox_id = std::move(*id);
    for (auto [name, target] :
         {std::pair{"templateID", &r.template_id}, std::pair{"envdVersion", &r.envd_version},
          std::pair{"envdAccessToken", &r.envd_access_token}, std::pair{"domain", &r.domain}}) {
        auto v = string_field(o, name, false, "a Sandbox");
        if (!v) return std::move(v).error();
        *target = std::move(*v);
    }
    return r;
}

result<sandbox_detail> parse_sandbox_detail(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_root(parser, body, max_sandbox_body_bytes, "a SandboxDetail");
    if (!root) return std::move(root).error();
    auto d = detail_from(*root, "a SandboxDetail");
    if (d) d->network_reported = true;
    return d;
}

result<std::vector<sandbox_detail>> parse_sandbox_list(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_root(parser, body, max_list_body_bytes, "a sandbox list");
    if (!root) return std::move(root).error();
    simdjson::dom::array items;
    if (root->get_array().get(items) != simdjson::SUCCESS) {
        return bad("a sandbox list that is not a JSON array");
    }
    std::vector<sandbox_detail> out;
    for (auto item : items) {
        if (out.size() >= max_listed_sandboxes) {
            return bad("a list page of more than " + std::to_string(max_listed_sandboxes) +
                       " sandboxes");
        }
        auto d = detail_from(item, "a ListedSandbox");
        if (!d) return std::move(d).error();
        out.push_back(std::move(*d));
    }
    return out;
}

std::optional<std::string> parse_error_message(std::string_view body) {
    if (body.size() > max_error_body_bytes) return std::nullopt;
    simdjson::dom::parser parser;
    const simdjson::padded_string padded(body);
    simdjson::dom::element root;
    simdjson::dom::object o;
    if (parser.parse(padded).get(root) != simdjson::SUCCESS ||
        root.get_object().get(o) != simdjson::SUCCESS) {
        return std::nullopt;
    }
    std::string_view message;
    if (o["message"].get_string().get(message) != simdjson::SUCCESS) return std::nullopt;
    std::string out;
    for (const char c : message) {
        if (out.size() >= 200) {
            out += "...";
            break;
        }
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) continue;
        out += c;
    }
    return out;
}

result<std::chrono::system_clock::time_point> parse_timestamp(std::string_view s) {
    auto point = detail::parse_rfc3339(s);
    if (!point) return not_timestamp();
    return *point;
}

std::string encode_metadata_filter(const std::map<std::string, std::string>& filter) {
    std::string pairs;
    for (const auto& [key, value] : filter) {
        if (!pairs.empty()) pairs += '&';
        // Twice here: the server unescapes the whole value before it splits it (see the header).
        pairs += escape_component(escape_component(key));
        pairs += '=';
        pairs += escape_component(escape_component(value));
    }
    return escape_component(pairs);
}

bool is_valid_sandbox_id(std::string_view id) noexcept {
    if (id.empty() || id.size() > 64 || id.front() == '-' || id.back() == '-') return false;
    for (const char c : id) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    return true;
}

}  // namespace moat::e2b
