#include "serve/process_requests.hpp"

#include "core/json_writer.hpp"
#include "tools/tool_arguments.hpp"

#include <simdjson.h>

#include <charconv>
#include <csignal>
#include <cstdint>

namespace moat::serve {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

error bad(std::string what) {
    return make_error(errc::invalid_argument, std::move(what));
}

// The field, unless it is absent or null.
std::optional<element> field(const object& o, std::string_view name) {
    element e;
    if (o[name].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
}

result<std::optional<std::string>> string_field(const object& o, std::string_view name,
                                                std::string_view where) {
    auto e = field(o, name);
    if (!e) return std::optional<std::string>{};
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS) {
        return bad(std::string(where) + std::string(name) + " must be a string");
    }
    return std::optional<std::string>(std::string(s));
}

// A uint32 as proto3 JSON allows: a number or a decimal string.
std::optional<std::uint32_t> as_uint32(const element& e) {
    std::uint64_t n = 0;
    if (e.get_uint64().get(n) == simdjson::SUCCESS) {
        if (n > UINT32_MAX) return std::nullopt;
        return static_cast<std::uint32_t>(n);
    }
    std::string_view s;
    if (e.get_string().get(s) == simdjson::SUCCESS && !s.empty()) {
        std::uint32_t v = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc{} && end == s.data() + s.size()) return v;
    }
    return std::nullopt;
}

result<object> parse_object(simdjson::dom::parser& parser, const simdjson::padded_string& padded,
                            std::string_view message) {
    object o;
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) {
        return bad("the " + std::string(message) + " request is not a JSON object");
    }
    return o;
}

result<process_selector> selector_of(const object& request) {
    auto e = field(request, "process");
    object o;
    if (!e || e->get_object().get(o) != simdjson::SUCCESS) {
        return bad("the request has no \"process\" selector object");
    }
    process_selector s;
    if (auto pid = field(o, "pid")) {
        auto n = as_uint32(*pid);
        if (!n) return bad("process.pid must be an unsigned 32-bit number");
        s.pid = *n;
        return s;
    }
    auto tag = string_field(o, "tag", "process.");
    if (!tag) return std::move(tag).error();
    if (!*tag) return bad("the process selector names neither a pid nor a tag");
    s.tag = std::move(**tag);
    return s;
}

bool has_object(const object& o, std::string_view name) {
    auto e = field(o, name);
    object inner;
    return e && e->get_object().get(inner) == simdjson::SUCCESS;
}

}  // namespace

result<start_request> parse_start_request(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    auto request = parse_object(parser, padded, "Start");
    if (!request) return std::move(request).error();
    start_request out;
    auto p = field(*request, "process");
    object process;
    if (!p || p->get_object().get(process) != simdjson::SUCCESS) {
        return bad("the Start request has no \"process\" object");
    }
    auto cmd = string_field(process, "cmd", "process.");
    if (!cmd) return std::move(cmd).error();
    if (!*cmd || (*cmd)->empty()) return bad("process.cmd must be a non-empty string");
    out.process.cmd = std::move(**cmd);
    if (auto args = field(process, "args")) {
        simdjson::dom::array list;
        if (args->get_array().get(list) != simdjson::SUCCESS) {
            return bad("process.args must be an array of strings");
        }
        for (auto a : list) {
            std::string_view s;
            if (a.get_string().get(s) != simdjson::SUCCESS) {
                return bad("process.args must be an array of strings");
            }
            out.process.args.emplace_back(s);
        }
    }
    if (auto envs = field(process, "envs")) {
        object map;
        if (envs->get_object().get(map) != simdjson::SUCCESS) {
            return bad("process.envs must be an object of strings");
        }
        for (auto kv : map) {
            std::string_view v;
            if (kv.value.get_string().get(v) != simdjson::SUCCESS) {
                return bad("process.envs." + std::string(kv.key) + " must be a string");
            }
            if (kv.key.empty() || kv.key.find('=') != std::string_view::npos ||
                kv.key.find('\0') != std::string_view::npos) {
                return bad("process.envs has an invalid variable name");
            }
            out.process.envs[std::string(kv.key)] = std::string(v);
        }
    }
    auto cwd = string_field(process, "cwd", "process.");
    if (!cwd) return std::move(cwd).error();
    if (*cwd) out.process.cwd = std::move(**cwd);
    out.has_pty = has_object(*request, "pty");
    auto tag = string_field(*request, "tag", "");
    if (!tag) return std::move(tag).error();
    out.tag = std::move(*tag);
    if (auto s = field(*request, "stdin")) {
        bool b = true;
        if (s->get_bool().get(b) != simdjson::SUCCESS) return bad("stdin must be a boolean");
        out.stdin_open = b;
    }
    return out;
}

result<process_selector> parse_selector_request(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    auto request = parse_object(parser, padded, "process");
    if (!request) return std::move(request).error();
    return selector_of(*request);
}

result<send_input_request> parse_send_input_request(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    auto request = parse_object(parser, padded, "SendInput");
    if (!request) return std::move(request).error();
    auto selector = selector_of(*request);
    if (!selector) return std::move(selector).error();
    send_input_request out;
    out.process = std::move(*selector);
    auto in = field(*request, "input");
    object input;
    if (!in || in->get_object().get(input) != simdjson::SUCCESS) {
        return bad("the SendInput request has no \"input\" object");
    }
    std::string_view text;
    if (auto e = field(input, "stdin")) {
        if (e->get_string().get(text) != simdjson::SUCCESS)
            return bad("input.stdin must be base64");
    } else if (auto p = field(input, "pty")) {
        if (p->get_string().get(text) != simdjson::SUCCESS) return bad("input.pty must be base64");
        out.is_pty = true;
    } else {
        return bad("input names neither stdin nor pty");
    }
    auto bytes = base64_decode(text);
    if (!bytes) return bad(out.is_pty ? "input.pty is not base64" : "input.stdin is not base64");
    out.bytes = std::move(*bytes);
    return out;
}

result<send_signal_request> parse_send_signal_request(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    auto request = parse_object(parser, padded, "SendSignal");
    if (!request) return std::move(request).error();
    auto selector = selector_of(*request);
    if (!selector) return std::move(selector).error();
    send_signal_request out;
    out.process = std::move(*selector);
    out.name = "SIGNAL_UNSPECIFIED";
    if (auto e = field(*request, "signal")) {
        std::string_view name;
        std::int64_t number = 0;
        if (e->get_string().get(name) == simdjson::SUCCESS) {
            out.name = std::string(name);
        } else if (e->get_int64().get(number) == simdjson::SUCCESS) {
            out.name = std::to_string(number);
        } else {
            return bad("signal must be a Signal name or number");
        }
        if (out.name == "SIGNAL_SIGKILL" || number == SIGKILL) out.signal = SIGKILL;
        if (out.name == "SIGNAL_SIGTERM" || number == SIGTERM) out.signal = SIGTERM;
    }
    return out;
}

result<update_request> parse_update_request(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    auto request = parse_object(parser, padded, "Update");
    if (!request) return std::move(request).error();
    auto selector = selector_of(*request);
    if (!selector) return std::move(selector).error();
    update_request out;
    out.process = std::move(*selector);
    out.has_pty = has_object(*request, "pty");
    return out;
}

std::string encode_start_event(std::uint32_t pid) {
    json_writer w;
    w.begin_object().key("event").begin_object().key("start").begin_object();
    w.key("pid").value(static_cast<std::uint64_t>(pid));
    w.end_object().end_object().end_object();
    return w.take();
}

std::string encode_data_event(output_channel channel, std::string_view bytes) {
    json_writer w;
    w.begin_object().key("event").begin_object().key("data").begin_object();
    w.key(channel == output_channel::out ? "stdout" : "stderr").value(base64_encode(bytes));
    w.end_object().end_object().end_object();
    return w.take();
}

std::string encode_end_event(const process_end& end) {
    json_writer w;
    w.begin_object().key("event").begin_object().key("end").begin_object();
    if (end.exit_code != 0) w.key("exitCode").value(end.exit_code);
    if (end.exited) w.key("exited").value(true);
    w.key("status").value(end.status);
    if (end.error) w.key("error").value(*end.error);
    w.end_object().end_object().end_object();
    return w.take();
}

std::string encode_keepalive_event() {
    return R"({"event":{"keepalive":{}}})";
}

std::string encode_list_response(const std::vector<process_info>& processes) {
    json_writer w;
    w.begin_object().key("processes").begin_array();
    for (const auto& p : processes) {
        w.begin_object().key("config").begin_object();
        w.key("cmd").value(p.config.cmd);
        w.key("args").begin_array();
        for (const auto& a : p.config.args) w.value(a);
        w.end_array();
        w.key("envs").begin_object();
        for (const auto& [k, v] : p.config.envs) w.key(k).value(v);
        w.end_object();
        if (!p.config.cwd.empty()) w.key("cwd").value(p.config.cwd);
        w.end_object();
        w.key("pid").value(static_cast<std::uint64_t>(p.pid));
        if (p.tag) w.key("tag").value(*p.tag);
        w.end_object();
    }
    w.end_array().end_object();
    return w.take();
}

}  // namespace moat::serve
