#include "e2b_protocol/process_messages.hpp"

#include "core/base64.hpp"
#include "core/go_signals.hpp"
#include "core/json_writer.hpp"
#include "e2b_protocol/json_fields.hpp"

#include <csignal>

namespace moat::e2b_protocol {
namespace {

using detail::as_integer;
using detail::field;
using simdjson::dom::element;
using simdjson::dom::object;

// --- what moat serve reads: requests (invalid_argument) ---

error invalid(std::string what) {
    return make_error(errc::invalid_argument, std::move(what));
}

result<std::optional<std::string>> optional_string(const object& o, std::string_view name,
                                                   std::string_view where) {
    auto e = field(o, name);
    if (!e) return std::optional<std::string>{};
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS) {
        return invalid(std::string(where) + std::string(name) + " must be a string");
    }
    return std::optional<std::string>(std::string(s));
}

result<process_selector> selector_of(const object& request) {
    auto e = field(request, "process");
    object o;
    if (!e || e->get_object().get(o) != simdjson::SUCCESS) {
        return invalid("the request has no \"process\" selector object");
    }
    process_selector s;
    if (auto pid = field(o, "pid")) {
        auto n = as_integer<std::uint32_t>(*pid);
        if (!n) return invalid("process.pid must be an unsigned 32-bit number");
        s.pid = *n;
        return s;
    }
    auto tag = optional_string(o, "tag", "process.");
    if (!tag) return std::move(tag).error();
    if (!*tag) return invalid("the process selector names neither a pid nor a tag");
    s.tag = std::move(**tag);
    return s;
}

// A request that names a process (`message` names the call): `doc` parsed, and its selector.
result<process_selector> selected(std::string_view json, std::string_view message,
                                  detail::document& doc) {
    if (!detail::parse_document(json, doc)) {
        return invalid("the " + std::string(message) + " request is not a JSON object");
    }
    return selector_of(doc.root);
}

// The same, as a Request (SendInput, SendSignal, Update) whose `process` is that selector.
template <class Request>
result<Request> selected_request(std::string_view json, std::string_view message,
                                 detail::document& doc) {
    auto selector = selected(json, message, doc);
    if (!selector) return std::move(selector).error();
    Request out;
    out.process = std::move(*selector);
    return out;
}

// The request's "pty" object: whether there is one, and its size (0 where absent).
result<bool> read_pty(const object& request, pty_size& out) {
    auto e = field(request, "pty");
    object pty;
    if (!e || e->get_object().get(pty) != simdjson::SUCCESS) return false;
    auto size = field(pty, "size");
    object sides;
    if (!size || size->get_object().get(sides) != simdjson::SUCCESS) return true;
    for (auto [name, side] : {std::pair{"cols", &out.cols}, std::pair{"rows", &out.rows}}) {
        auto v = field(sides, name);
        if (!v) continue;
        auto n = as_integer<std::uint32_t>(*v);
        if (!n || *n > 4096) {
            return invalid(std::string("pty.size.") + name + " must be a number up to 4096");
        }
        *side = *n;
    }
    return true;
}

result<void> read_config(const object& process, process_config& out) {
    auto cmd = optional_string(process, "cmd", "process.");
    if (!cmd) return std::move(cmd).error();
    if (!*cmd || (*cmd)->empty()) return invalid("process.cmd must be a non-empty string");
    out.cmd = std::move(**cmd);
    if (auto args = field(process, "args")) {
        simdjson::dom::array list;
        if (args->get_array().get(list) != simdjson::SUCCESS) {
            return invalid("process.args must be an array of strings");
        }
        for (auto a : list) {
            std::string_view s;
            if (a.get_string().get(s) != simdjson::SUCCESS) {
                return invalid("process.args must be an array of strings");
            }
            out.args.emplace_back(s);
        }
    }
    if (auto envs = field(process, "envs")) {
        object map;
        if (envs->get_object().get(map) != simdjson::SUCCESS) {
            return invalid("process.envs must be an object of strings");
        }
        for (auto kv : map) {
            std::string_view v;
            if (kv.value.get_string().get(v) != simdjson::SUCCESS) {
                return invalid("process.envs." + std::string(kv.key) + " must be a string");
            }
            if (kv.key.empty() || kv.key.find('=') != std::string_view::npos ||
                kv.key.find('\0') != std::string_view::npos) {
                return invalid("process.envs has an invalid variable name");
            }
            out.envs[std::string(kv.key)] = std::string(v);
        }
    }
    auto cwd = optional_string(process, "cwd", "process.");
    if (!cwd) return std::move(cwd).error();
    if (*cwd) out.cwd = std::move(**cwd);
    return {};
}

// --- what the envd client reads: envd's messages (protocol_error) ---

error bad(std::string what) {
    return make_error(errc::protocol_error, "envd sent " + std::move(what));
}

template <class Int>
result<Int> integer_field(const object& o, std::string_view name, std::string_view where) {
    auto e = field(o, name);
    if (!e) return Int{};
    auto n = as_integer<Int>(*e);
    if (!n) return bad(std::string(where) + std::string(name) + " that is not an integer");
    return *n;
}

result<std::string> string_field(const object& o, std::string_view name, std::string_view where) {
    auto e = field(o, name);
    if (!e) return std::string();
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS)
        return bad(std::string(where) + std::string(name) + " that is not a string");
    return std::string(s);
}

result<bool> bool_field(const object& o, std::string_view name, std::string_view where) {
    auto e = field(o, name);
    if (!e) return false;
    bool b = false;
    if (e->get_bool().get(b) != simdjson::SUCCESS)
        return bad(std::string(where) + std::string(name) + " that is not a boolean");
    return b;
}

// An event's inner object ("start", "data", "end").
result<object> event_object(const element& e, std::string_view what) {
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS)
        return bad(std::string(what) + " that is not an object");
    return o;
}

result<process_event> start_of(const element& e) {
    auto o = event_object(e, "a start");
    if (!o) return std::move(o).error();
    auto pid = integer_field<std::uint32_t>(*o, "pid", "a start event with a ");
    if (!pid) return std::move(pid).error();
    if (*pid == 0) return bad("a start event without a pid");
    return process_event{start_event{*pid}};
}

result<process_event> data_of(const element& e) {
    auto o = event_object(e, "a data event");
    if (!o) return std::move(o).error();
    data_event d;
    std::optional<element> bytes = field(*o, "stdout");
    if (!bytes) {
        bytes = field(*o, "stderr");
        d.channel = output_channel::err;
    }
    if (!bytes) return bad("a data event with neither stdout nor stderr");
    std::string_view b64;
    if (bytes->get_string().get(b64) != simdjson::SUCCESS)
        return bad("a data event whose bytes are not a string");
    auto decoded = base64_decode(b64);
    if (!decoded) return bad("a data event whose bytes are not base64");
    d.bytes = std::move(*decoded);
    return process_event{std::move(d)};
}

result<process_event> end_of(const element& e) {
    auto o = event_object(e, "an end");
    if (!o) return std::move(o).error();
    end_event end;
    auto code = integer_field<std::int32_t>(*o, "exitCode", "an end event with an ");
    if (!code) return std::move(code).error();
    end.exit_code = *code;
    auto exited = bool_field(*o, "exited", "an end event with an ");
    if (!exited) return std::move(exited).error();
    end.exited = *exited;
    auto status = string_field(*o, "status", "an end event with a ");
    if (!status) return std::move(status).error();
    end.status = std::move(*status);
    if (field(*o, "error")) {
        auto why = string_field(*o, "error", "an end event with an ");
        if (!why) return std::move(why).error();
        end.error = std::move(*why);
    }
    return process_event{std::move(end)};
}

// A listed process's config, as List reports it (every field optional).
result<void> listed_config(const object& o, process_config& out) {
    auto e = field(o, "config");
    if (!e) return {};
    object config;
    if (e->get_object().get(config) != simdjson::SUCCESS)
        return bad("a process list entry whose config is not an object");
    constexpr std::string_view where = "a process list entry with a config.";
    auto cmd = string_field(config, "cmd", where);
    if (!cmd) return std::move(cmd).error();
    out.cmd = std::move(*cmd);
    auto cwd = string_field(config, "cwd", where);
    if (!cwd) return std::move(cwd).error();
    out.cwd = std::move(*cwd);
    simdjson::dom::array args;
    if (auto a = field(config, "args")) {
        if (a->get_array().get(args) != simdjson::SUCCESS)
            return bad("a process list entry whose config.args is not an array");
        for (auto arg : args) {
            std::string_view s;
            if (arg.get_string().get(s) != simdjson::SUCCESS)
                return bad("a process list entry with a config.args entry that is not a string");
            out.args.emplace_back(s);
        }
    }
    if (auto envs = field(config, "envs")) {
        object map;
        if (envs->get_object().get(map) != simdjson::SUCCESS)
            return bad("a process list entry whose config.envs is not an object");
        for (auto kv : map) {
            std::string_view v;
            if (kv.value.get_string().get(v) != simdjson::SUCCESS)
                return bad("a process list entry with a config.envs value that is not a string");
            out.envs[std::string(kv.key)] = std::string(v);
        }
    }
    return {};
}

// One entry of a process list.
result<listed_process> listed_of(const element& item) {
    object o;
    if (item.get_object().get(o) != simdjson::SUCCESS)
        return bad("a process list with an entry that is not an object");
    listed_process p;
    auto pid = integer_field<std::uint32_t>(o, "pid", "a process list entry with a ");
    if (!pid) return std::move(pid).error();
    p.pid = *pid;
    if (field(o, "tag")) {
        auto tag = string_field(o, "tag", "a process list entry with a ");
        if (!tag) return std::move(tag).error();
        p.tag = std::move(*tag);
    }
    if (auto config = listed_config(o, p.config); !config) return std::move(config).error();
    return p;
}

// --- writers ---

void write_selector(json_writer& w, const process_selector& s) {
    w.key("process").begin_object();
    if (s.pid) {
        w.key("pid").value(static_cast<std::uint64_t>(*s.pid));
    } else if (s.tag) {
        w.key("tag").value(*s.tag);
    }
    w.end_object();
}

void write_config(json_writer& w, const process_config& c) {
    w.begin_object();
    w.key("cmd").value(c.cmd);
    w.key("args").begin_array();
    for (const auto& a : c.args) w.value(a);
    w.end_array();
    w.key("envs").begin_object();
    for (const auto& [k, v] : c.envs) w.key(k).value(v);
    w.end_object();
    if (!c.cwd.empty()) w.key("cwd").value(c.cwd);
    w.end_object();
}

// {"event":{"<kind>":<inner>}}, the inner object written by `inner`.
template <class Inner>
std::string event(std::string_view kind, Inner inner) {
    json_writer w;
    w.begin_object().key("event").begin_object().key(kind).begin_object();
    inner(w);
    w.end_object().end_object().end_object();
    return w.take();
}

std::optional<std::string_view> signal_name(int signal) {
    if (signal == SIGKILL) return "SIGNAL_SIGKILL";
    if (signal == SIGTERM) return "SIGNAL_SIGTERM";
    return std::nullopt;
}

}  // namespace

std::string encode_start_request(const start_request& r) {
    json_writer w;
    w.begin_object().key("process");
    write_config(w, r.process);
    if (r.has_pty) {
        w.key("pty").begin_object();
        if (r.pty.cols != 0 || r.pty.rows != 0) {
            w.key("size").begin_object().key("cols").value(static_cast<std::uint64_t>(r.pty.cols));
            w.key("rows").value(static_cast<std::uint64_t>(r.pty.rows)).end_object();
        }
        w.end_object();
    }
    if (r.tag) w.key("tag").value(*r.tag);
    w.key("stdin").value(r.stdin_open);
    w.end_object();
    return w.take();
}

result<start_request> parse_start_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc))
        return invalid("the Start request is not a JSON object");
    const object& request = doc.root;
    start_request out;
    auto p = field(request, "process");
    object process;
    if (!p || p->get_object().get(process) != simdjson::SUCCESS) {
        return invalid("the Start request has no \"process\" object");
    }
    if (auto read = read_config(process, out.process); !read) return std::move(read).error();
    auto pty = read_pty(request, out.pty);
    if (!pty) return std::move(pty).error();
    out.has_pty = *pty;
    auto tag = optional_string(request, "tag", "");
    if (!tag) return std::move(tag).error();
    out.tag = std::move(*tag);
    if (auto s = field(request, "stdin")) {
        bool b = true;
        if (s->get_bool().get(b) != simdjson::SUCCESS) return invalid("stdin must be a boolean");
        out.stdin_open = b;
    }
    return out;
}

std::string encode_selector_request(const process_selector& process) {
    json_writer w;
    w.begin_object();
    write_selector(w, process);
    w.end_object();
    return w.take();
}

result<process_selector> parse_selector_request(std::string_view json) {
    detail::document doc;
    return selected(json, "process", doc);
}

std::string encode_send_input_request(const send_input_request& r) {
    json_writer w;
    w.begin_object();
    write_selector(w, r.process);
    w.key("input").begin_object().key(r.is_pty ? "pty" : "stdin").value(base64_encode(r.bytes));
    w.end_object().end_object();
    return w.take();
}

result<send_input_request> parse_send_input_request(std::string_view json) {
    detail::document doc;
    auto out = selected_request<send_input_request>(json, "SendInput", doc);
    if (!out) return out;
    auto in = field(doc.root, "input");
    object input;
    if (!in || in->get_object().get(input) != simdjson::SUCCESS) {
        return invalid("the SendInput request has no \"input\" object");
    }
    std::string_view text;
    if (auto e = field(input, "stdin")) {
        if (e->get_string().get(text) != simdjson::SUCCESS)
            return invalid("input.stdin must be base64");
    } else if (auto p = field(input, "pty")) {
        if (p->get_string().get(text) != simdjson::SUCCESS)
            return invalid("input.pty must be base64");
        out->is_pty = true;
    } else {
        return invalid("input names neither stdin nor pty");
    }
    auto bytes = base64_decode(text);
    if (!bytes)
        return invalid(out->is_pty ? "input.pty is not base64" : "input.stdin is not base64");
    out->bytes = std::move(*bytes);
    return out;
}

std::optional<std::string> encode_send_signal_request(const send_signal_request& r) {
    const auto name = signal_name(r.signal);
    if (!name) return std::nullopt;
    json_writer w;
    w.begin_object();
    write_selector(w, r.process);
    w.key("signal").value(*name);
    w.end_object();
    return w.take();
}

result<send_signal_request> parse_send_signal_request(std::string_view json) {
    detail::document doc;
    auto out = selected_request<send_signal_request>(json, "SendSignal", doc);
    if (!out) return out;
    out->name = "SIGNAL_UNSPECIFIED";
    if (auto e = field(doc.root, "signal")) {
        std::string_view name;
        std::int64_t number = 0;
        if (e->get_string().get(name) == simdjson::SUCCESS) {
            out->name = std::string(name);
        } else if (e->get_int64().get(number) == simdjson::SUCCESS) {
            out->name = std::to_string(number);
        } else {
            return invalid("signal must be a Signal name or number");
        }
        if (out->name == "SIGNAL_SIGKILL" || number == SIGKILL) out->signal = SIGKILL;
        if (out->name == "SIGNAL_SIGTERM" || number == SIGTERM) out->signal = SIGTERM;
    }
    return out;
}

result<update_request> parse_update_request(std::string_view json) {
    detail::document doc;
    auto out = selected_request<update_request>(json, "Update", doc);
    if (!out) return out;
    auto pty = read_pty(doc.root, out->pty);
    if (!pty) return std::move(pty).error();
    out->has_pty = *pty;
    return out;
}

std::string encode_start_event(std::uint32_t pid) {
    return event("start",
                 [pid](json_writer& w) { w.key("pid").value(static_cast<std::uint64_t>(pid)); });
}

std::string encode_data_event(output_channel channel, std::string_view bytes) {
    return event("data", [channel, bytes](json_writer& w) {
        w.key(channel == output_channel::out ? "stdout" : "stderr").value(base64_encode(bytes));
    });
}

std::string encode_pty_data_event(std::string_view bytes) {
    return event("data", [bytes](json_writer& w) { w.key("pty").value(base64_encode(bytes)); });
}

std::string encode_end_event(const end_event& end) {
    return event("end", [&end](json_writer& w) {
        if (end.exit_code != 0) w.key("exitCode").value(end.exit_code);
        if (end.exited) w.key("exited").value(true);
        w.key("status").value(end.status);
        if (end.error) w.key("error").value(*end.error);
    });
}

std::string encode_keepalive_event() {
    return R"({"event":{"keepalive":{}}})";
}

result<process_event> parse_process_event(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return bad("a process event that is not a JSON object");
    auto e = field(doc.root, "event");
    object event;
    if (!e || e->get_object().get(event) != simdjson::SUCCESS)
        return bad("a process message with no event object");
    if (auto start = field(event, "start")) return start_of(*start);
    if (auto data = field(event, "data")) return data_of(*data);
    if (auto end = field(event, "end")) return end_of(*end);
    if (field(event, "keepalive")) return process_event{keepalive_event{}};
    return bad("a process event of no known kind");
}

exec_result result_from_end(const end_event& end) {
    exec_result r;
    if (end.exited) {
        r.exit_code = end.exit_code;
        return r;
    }
    std::string_view status = end.status;
    int signal = 0;
    if (status.starts_with("signal: ")) {
        status.remove_prefix(8);
        // "signal: killed (core dumped)"
        if (const auto core = status.find(" (core dumped)"); core != std::string_view::npos)
            status = status.substr(0, core);
        signal = moat::detail::signal_from_go_name(status);
    }
    if (signal == 0) signal = SIGKILL;  // not exited, and no known signal: it was killed
    r.signal = signal;
    r.exit_code = 128 + signal;
    return r;
}

std::string encode_list_response(const std::vector<listed_process>& processes) {
    json_writer w;
    w.begin_object().key("processes").begin_array();
    for (const auto& p : processes) {
        w.begin_object().key("config");
        write_config(w, p.config);
        w.key("pid").value(static_cast<std::uint64_t>(p.pid));
        if (p.tag) w.key("tag").value(*p.tag);
        w.end_object();
    }
    w.end_array().end_object();
    return w.take();
}

result<std::vector<listed_process>> parse_list_response(std::string_view json) {
    std::vector<listed_process> out;
    auto read =
        detail::for_each_element(json, "processes", bad("a process list that is not a JSON object"),
                                 bad("a process list whose processes are not an array"),
                                 [&](const element& item) -> result<void> {
                                     auto p = listed_of(item);
                                     if (!p) return std::move(p).error();
                                     out.push_back(std::move(*p));
                                     return {};
                                 });
    if (!read) return std::move(read).error();
    return out;
}

}  // namespace moat::e2b_protocol
