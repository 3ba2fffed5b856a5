#include "e2b_protocol/sandbox_replies.hpp"

#include "core/json_writer.hpp"
#include "core/rfc3339.hpp"
#include "e2b_protocol/json_fields.hpp"

namespace moat::e2b_protocol {
namespace {

using detail::field;
using simdjson::dom::object;

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
result<std::string> string_field(object o, const char* name, bool required, const char* what) {
    const auto e = field(o, name);
    if (!e) {
        if (required) return bad(std::string(what) + " without '" + name + "'");
        return std::string();
    }
    std::string_view v;
    if (e->get_string().get(v) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose '" + name + "' is not a string");
    }
    if (v.size() > max_string_bytes) {
        return bad(std::string(what) + " whose '" + name + "' is over " +
                   std::to_string(max_string_bytes) + " bytes");
    }
    return std::string(v);
}

// The optional string fields named, each into its target.
result<void> string_fields(object o,
                           std::initializer_list<std::pair<const char*, std::string*>> fields,
                           const char* what) {
    for (auto [name, target] : fields) {
        auto v = string_field(o, name, false, what);
        if (!v) return std::move(v).error();
        *target = std::move(*v);
    }
    return {};
}

// A Sandbox's or a SandboxDetail's object, its required sandboxID checked (is_valid_sandbox_id)
// into `id`.
result<object> sandbox_object(simdjson::dom::element e, const char* what, std::string& id) {
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) {
        return bad(std::string(what) + " that is not a JSON object");
    }
    auto sent = string_field(o, "sandboxID", true, what);
    if (!sent) return std::move(sent).error();
    if (!is_valid_sandbox_id(*sent)) return bad(std::string(what) + " with an invalid 'sandboxID'");
    id = std::move(*sent);
    return o;
}

// An integer field, as a number or a decimal string; absent or null: 0.
result<std::int64_t> integer_field(object o, const char* name, const char* what) {
    const auto e = field(o, name);
    if (!e) return std::int64_t{0};
    if (auto n = detail::as_integer<std::int64_t>(*e)) return *n;
    return bad(std::string(what) + " whose '" + name + "' is not an integer");
}

result<std::chrono::system_clock::time_point> time_field(object o, const char* name,
                                                         const char* what) {
    auto text = string_field(o, name, true, what);
    if (!text) return std::move(text).error();
    auto t = moat::detail::parse_rfc3339(*text);
    if (!t) return bad(std::string(what) + " whose '" + name + "' is not an RFC 3339 date-time");
    return *t;
}

result<void> metadata_field(object o, std::map<std::string, std::string>& out, const char* what) {
    const auto e = field(o, "metadata");
    if (!e) return {};
    object m;
    if (e->get_object().get(m) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose 'metadata' is not an object");
    }
    for (auto entry : m) {
        std::string_view v;
        if (entry.value.get_string().get(v) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'metadata' has a value that is not a string");
        }
        if (entry.key.size() > max_string_bytes || v.size() > max_string_bytes) {
            return bad(std::string(what) + " with a metadata entry over " +
                       std::to_string(max_string_bytes) + " bytes");
        }
        if (out.size() >= max_metadata_entries) {
            return bad(std::string(what) + " with more than " +
                       std::to_string(max_metadata_entries) + " metadata entries");
        }
        out[std::string(entry.key)] = std::string(v);
    }
    return {};
}

// One of network.allowOut / network.denyOut: absent or null gives none.
result<void> network_list_field(object network, const char* name, std::vector<std::string>& out,
                                const char* what) {
    const auto e = field(network, name);
    if (!e) return {};
    simdjson::dom::array items;
    const std::string whose = std::string(what) + " whose 'network." + name + "'";
    if (e->get_array().get(items) != simdjson::SUCCESS) return bad(whose + " is not an array");
    for (auto item : items) {
        std::string_view v;
        if (item.get_string().get(v) != simdjson::SUCCESS) {
            return bad(whose + " has an entry that is not a string");
        }
        if (v.size() > max_string_bytes) {
            return bad(whose + " has an entry over " + std::to_string(max_string_bytes) + " bytes");
        }
        if (out.size() >= max_network_entries) {
            return bad(whose + " has more than " + std::to_string(max_network_entries) +
                       " entries");
        }
        out.emplace_back(v);
    }
    return {};
}

// allowInternetAccess and the network object of a SandboxDetail.
result<void> network_fields(object o, sandbox_detail& d, const char* what) {
    if (const auto e = field(o, "allowInternetAccess")) {
        bool on = false;
        if (e->get_bool().get(on) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'allowInternetAccess' is not a boolean");
        }
        d.allow_internet_access = on;
    }
    const auto e = field(o, "network");
    if (!e) return {};
    object network;
    if (e->get_object().get(network) != simdjson::SUCCESS) {
        return bad(std::string(what) + " whose 'network' is not an object");
    }
    if (auto ok = network_list_field(network, "allowOut", d.allow_out, what); !ok) return ok;
    if (auto ok = network_list_field(network, "denyOut", d.deny_out, what); !ok) return ok;
    if (const auto traffic = field(network, "allowPublicTraffic")) {
        bool open = false;
        if (traffic->get_bool().get(open) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'network.allowPublicTraffic' is not a boolean");
        }
        d.allow_public_traffic = open;
    }
    if (const auto mask = field(network, "maskRequestHost")) {
        std::string_view host;
        if (mask->get_string().get(host) != simdjson::SUCCESS) {
            return bad(std::string(what) + " whose 'network.maskRequestHost' is not a string");
        }
        d.mask_request_host = std::string(host);
    }
    return {};
}

result<sandbox_detail> detail_from(simdjson::dom::element element, const char* what) {
    sandbox_detail d;
    auto found = sandbox_object(element, what, d.sandbox_id);
    if (!found) return std::move(found).error();
    const object o = *found;
    auto strings = string_fields(o,
                                 {{"templateID", &d.template_id},
                                  {"alias", &d.alias},
                                  {"clientID", &d.client_id},
                                  {"state", &d.state},
                                  {"envdVersion", &d.envd_version},
                                  {"envdAccessToken", &d.envd_access_token},
                                  {"domain", &d.domain}},
                                 what);
    if (!strings) return std::move(strings).error();
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

void write_domain(json_writer& w, const std::string& domain) {
    w.key("domain");
    if (domain.empty()) {
        w.null();
    } else {
        w.value(domain);
    }
}

// A ListedSandbox, or with `detail` a SandboxDetail.
void write_detail(json_writer& w, const sandbox_detail& d, bool detail) {
    w.begin_object();
    w.key("templateID").value(d.template_id);
    w.key("alias").value(d.alias);
    w.key("sandboxID").value(d.sandbox_id);
    w.key("clientID").value(d.client_id);
    w.key("startedAt").value(format_rfc3339(d.started_at));
    w.key("endAt").value(format_rfc3339(d.end_at));
    w.key("cpuCount").value(d.cpu_count);
    w.key("memoryMB").value(d.memory_mb);
    w.key("diskSizeMB").value(d.disk_size_mb);
    w.key("state").value(d.state);
    w.key("envdVersion").value(d.envd_version);
    w.key("metadata").begin_object();
    for (const auto& [k, v] : d.metadata) w.key(k).value(v);
    w.end_object();
    if (detail) {
        w.key("envdAccessToken").value(d.envd_access_token);
        if (d.allow_internet_access) w.key("allowInternetAccess").value(*d.allow_internet_access);
        const bool lists = !d.allow_out.empty() || !d.deny_out.empty();
        if (lists || d.allow_public_traffic || d.mask_request_host) {
            w.key("network").begin_object();
            if (lists) {
                w.key("allowOut").begin_array();
                for (const auto& entry : d.allow_out) w.value(entry);
                w.end_array();
                w.key("denyOut").begin_array();
                for (const auto& entry : d.deny_out) w.value(entry);
                w.end_array();
            }
            if (d.allow_public_traffic) w.key("allowPublicTraffic").value(*d.allow_public_traffic);
            if (d.mask_request_host) w.key("maskRequestHost").value(*d.mask_request_host);
            w.end_object();
        }
        write_domain(w, d.domain);
        w.key("lifecycle").begin_object();
        w.key("onTimeout").value(d.on_timeout);
        w.key("autoResume").value(d.auto_resume);
        w.end_object();
    }
    w.end_object();
}

}  // namespace

std::string encode_sandbox_reply(const sandbox_reply& r) {
    json_writer w;
    w.begin_object();
    w.key("templateID").value(r.template_id);
    w.key("sandboxID").value(r.sandbox_id);
    w.key("alias").value(r.alias);
    w.key("clientID").value(r.client_id);
    w.key("envdVersion").value(r.envd_version);
    w.key("envdAccessToken").value(r.envd_access_token);
    w.key("trafficAccessToken");
    if (r.traffic_access_token.empty()) {
        w.null();
    } else {
        w.value(r.traffic_access_token);
    }
    write_domain(w, r.domain);
    w.end_object();
    return w.take();
}

result<sandbox_reply> parse_sandbox_reply(std::string_view body) {
    constexpr const char* what = "a Sandbox";
    simdjson::dom::parser parser;
    auto root = parse_root(parser, body, max_sandbox_body_bytes, what);
    if (!root) return std::move(root).error();
    sandbox_reply r;
    auto o = sandbox_object(*root, what, r.sandbox_id);
    if (!o) return std::move(o).error();
    auto strings = string_fields(*o,
                                 {{"templateID", &r.template_id},
                                  {"alias", &r.alias},
                                  {"clientID", &r.client_id},
                                  {"envdVersion", &r.envd_version},
                                  {"envdAccessToken", &r.envd_access_token},
                                  {"trafficAccessToken", &r.traffic_access_token},
                                  {"domain", &r.domain}},
                                 what);
    if (!strings) return std::move(strings).error();
    return r;
}

std::string encode_sandbox_detail(const sandbox_detail& d) {
    json_writer w;
    write_detail(w, d, true);
    return w.take();
}

result<sandbox_detail> parse_sandbox_detail(std::string_view body) {
    simdjson::dom::parser parser;
    auto root = parse_root(parser, body, max_sandbox_body_bytes, "a SandboxDetail");
    if (!root) return std::move(root).error();
    auto d = detail_from(*root, "a SandboxDetail");
    if (d) d->network_reported = true;
    return d;
}

std::string encode_sandbox_list(const std::vector<sandbox_detail>& sandboxes) {
    json_writer w;
    w.begin_array();
    for (const auto& d : sandboxes) write_detail(w, d, false);
    w.end_array();
    return w.take();
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

}  // namespace moat::e2b_protocol
