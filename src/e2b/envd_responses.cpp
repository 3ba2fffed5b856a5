#include "e2b/envd_responses.hpp"

#include "core/file_metadata.hpp"
#include "core/go_signals.hpp"
#include "core/json_writer.hpp"

#include <simdjson.h>

#include <array>
#include <charconv>
#include <csignal>
#include <limits>
#include <type_traits>

namespace moat::e2b {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

error bad(std::string what) {
    return make_error(errc::protocol_error, "envd sent " + std::move(what));
}

std::optional<element> field(const object& o, std::string_view name) {
    element e;
    if (o[name].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
}

// A proto3 integer: a JSON number or a decimal string.
template <class Int>
std::optional<Int> as_integer(const element& e) {
    if constexpr (std::is_signed_v<Int>) {
        std::int64_t n = 0;
        if (e.get_int64().get(n) == simdjson::SUCCESS) {
            if (n < std::numeric_limits<Int>::min() || n > std::numeric_limits<Int>::max())
                return std::nullopt;
            return static_cast<Int>(n);
        }
    } else {
        std::uint64_t n = 0;
        if (e.get_uint64().get(n) == simdjson::SUCCESS) {
            if (n > std::numeric_limits<Int>::max()) return std::nullopt;
            return static_cast<Int>(n);
        }
    }
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS || s.empty()) return std::nullopt;
    Int v{};
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
    return v;
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

result<object> object_field(const object& o, std::string_view name, std::string_view where) {
    auto e = field(o, name);
    object inner;
    if (!e || e->get_object().get(inner) != simdjson::SUCCESS)
        return bad(std::string(where) + "no " + std::string(name) + " object");
    return inner;
}

result<object> parse_document(simdjson::dom::parser& parser, const simdjson::padded_string& text,
                              std::string_view what) {
    object root;
    if (parser.parse(text).get_object().get(root) != simdjson::SUCCESS)
        return bad(std::string(what) + " that is not a JSON object");
    return root;
}

result<entry_info> entry_of(const element& e) {
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) return bad("an entry that is not an object");
    entry_info info;
    auto name = string_field(o, "name", "an entry with a ");
    if (!name) return std::move(name).error();
    info.name = std::move(*name);
    auto path = string_field(o, "path", "an entry with a ");
    if (!path) return std::move(path).error();
    info.path = std::move(*path);
    if (auto type = field(o, "type")) {
        std::string_view s;
        std::int64_t n = -1;
        if (type->get_string().get(s) == simdjson::SUCCESS) {
            if (s == "FILE_TYPE_FILE")
                n = 1;
            else if (s == "FILE_TYPE_DIRECTORY")
                n = 2;
            else if (s == "FILE_TYPE_SYMLINK")
                n = 3;
            else
                n = 0;
        } else if (type->get_int64().get(n) != simdjson::SUCCESS) {
            return bad("an entry whose type is neither a name nor a number");
        }
        if (n == 1)
            info.type = file_type::regular;
        else if (n == 2)
            info.type = file_type::directory;
        else if (n == 3)
            info.type = file_type::symlink;
    }
    auto size = integer_field<std::int64_t>(o, "size", "an entry with a ");
    if (!size) return std::move(size).error();
    if (*size < 0) return bad("an entry with a negative size");
    info.size = static_cast<std::uint64_t>(*size);
    auto mode = integer_field<std::uint32_t>(o, "mode", "an entry with a ");
    if (!mode) return std::move(mode).error();
    // Go's FileMode keeps setuid, setgid and sticky far above the permission bits.
    std::uint32_t bits = *mode & 07777;
    if ((*mode & (1u << 23)) != 0) bits |= 04000;
    if ((*mode & (1u << 22)) != 0) bits |= 02000;
    if ((*mode & (1u << 20)) != 0) bits |= 01000;
    info.mode = bits;
    if (auto target = field(o, "symlinkTarget")) {
        std::string_view s;
        if (target->get_string().get(s) != simdjson::SUCCESS)
            return bad("an entry whose symlinkTarget is not a string");
        info.symlink_target = std::string(s);
    }
    if (auto metadata = field(o, "metadata")) {
        object m;
        if (metadata->get_object().get(m) != simdjson::SUCCESS)
            return bad("an entry whose metadata is not an object");
        detail::file_metadata_collector kept;
        for (auto [key, value] : m) {
            std::string_view text;
            if (value.get_string().get(text) != simdjson::SUCCESS)
                return bad("an entry whose metadata has a value that is not a string");
            kept.add(key, text);
        }
        info.metadata = kept.take();
    }
    return info;
}

void write_process_selector(json_writer& w, std::uint32_t pid) {
    w.key("process").begin_object().key("pid").value(static_cast<std::uint64_t>(pid)).end_object();
}

}  // namespace

result<process_event> parse_process_event(std::string_view json) {
    simdjson::dom::parser parser;
    const simdjson::padded_string text(json);
    auto root = parse_document(parser, text, "a process event");
    if (!root) return std::move(root).error();
    const object top = *root;
    auto event = object_field(top, "event", "a process message with ");
    if (!event) return std::move(event).error();
    if (auto start = field(*event, "start")) {
        object o;
        if (start->get_object().get(o) != simdjson::SUCCESS)
            return bad("a start that is not an object");
        auto pid = integer_field<std::uint32_t>(o, "pid", "a start event with a ");
        if (!pid) return std::move(pid).error();
        if (*pid == 0) return bad("a start event without a pid");
        return process_event{start_event{*pid}};
    }
    if (auto data = field(*event, "data")) {
        object o;
        if (data->get_object().get(o) != simdjson::SUCCESS)
            return bad("a data event that is not an object");
        data_event d;
        std::optional<element> bytes = field(o, "stdout");
        if (!bytes) {
            bytes = field(o, "stderr");
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
    if (auto end = field(*event, "end")) {
        object o;
        if (end->get_object().get(o) != simdjson::SUCCESS)
            return bad("an end that is not an object");
        end_event e;
        auto code = integer_field<std::int32_t>(o, "exitCode", "an end event with an ");
        if (!code) return std::move(code).error();
        e.exit_code = *code;
        auto exited = bool_field(o, "exited", "an end event with an ");
        if (!exited) return std::move(exited).error();
        e.exited = *exited;
        auto status = string_field(o, "status", "an end event with a ");
        if (!status) return std::move(status).error();
        e.status = std::move(*status);
        auto why = string_field(o, "error", "an end event with an ");
        if (!why) return std::move(why).error();
        e.error = std::move(*why);
        return process_event{std::move(e)};
    }
    if (field(*event, "keepalive")) return process_event{keepalive_event{}};
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
        signal = detail::signal_from_go_name(status);
    }
    if (signal == 0) signal = SIGKILL;  // not exited, and no known signal: it was killed
    r.signal = signal;
    r.exit_code = 128 + signal;
    return r;
}

std::string encode_start_request(const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& env,
                                 const std::string& cwd, const std::string& tag, bool stdin_open) {
    json_writer w;
    w.begin_object().key("process").begin_object();
    w.key("cmd").value(argv.empty() ? std::string_view() : std::string_view(argv.front()));
    w.key("args").begin_array();
    for (std::size_t i = 1; i < argv.size(); ++i) w.value(argv[i]);
    w.end_array();
    w.key("envs").begin_object();
    for (const auto& [k, v] : env) w.key(k).value(v);
    w.end_object();
    if (!cwd.empty()) w.key("cwd").value(cwd);
    w.end_object();
    if (!tag.empty()) w.key("tag").value(tag);
    w.key("stdin").value(stdin_open);
    w.end_object();
    return w.take();
}

std::string encode_selector_request(std::uint32_t pid) {
    json_writer w;
    w.begin_object();
    write_process_selector(w, pid);
    w.end_object();
    return w.take();
}

std::string encode_send_input_request(std::uint32_t pid, std::string_view bytes) {
    json_writer w;
    w.begin_object();
    write_process_selector(w, pid);
    w.key("input").begin_object().key("stdin").value(base64_encode(bytes)).end_object();
    w.end_object();
    return w.take();
}

namespace {
std::optional<std::string_view> signal_name(int signal) {
    if (signal == SIGKILL) return "SIGNAL_SIGKILL";
    if (signal == SIGTERM) return "SIGNAL_SIGTERM";
    return std::nullopt;
}
}  // namespace

std::optional<std::string> encode_send_signal_request(std::uint32_t pid, int signal) {
    const auto name = signal_name(signal);
    if (!name) return std::nullopt;
    json_writer w;
    w.begin_object();
    write_process_selector(w, pid);
    w.key("signal").value(*name);
    w.end_object();
    return w.take();
}

std::optional<std::string> encode_send_signal_by_tag(std::string_view tag, int signal) {
    const auto name = signal_name(signal);
    if (!name) return std::nullopt;
    json_writer w;
    w.begin_object();
    w.key("process").begin_object().key("tag").value(tag).end_object();
    w.key("signal").value(*name);
    w.end_object();
    return w.take();
}

result<std::vector<listed_process>> parse_list_response(std::string_view json) {
    simdjson::dom::parser parser;
    const simdjson::padded_string text(json);
    auto root = parse_document(parser, text, "a process list");
    if (!root) return std::move(root).error();
    const object top = *root;
    std::vector<listed_process> pids;
    auto processes = field(top, "processes");
    if (!processes) return pids;
    simdjson::dom::array items;
    if (processes->get_array().get(items) != simdjson::SUCCESS)
        return bad("a process list whose processes are not an array");
    for (element item : items) {
        object o;
        if (item.get_object().get(o) != simdjson::SUCCESS)
            return bad("a process list with an entry that is not an object");
        auto pid = integer_field<std::uint32_t>(o, "pid", "a process list entry with a ");
        if (!pid) return std::move(pid).error();
        auto tag = string_field(o, "tag", "a process list entry with a ");
        if (!tag) return std::move(tag).error();
        pids.push_back(listed_process{*pid, std::move(*tag)});
    }
    return pids;
}

result<entry_info> parse_entry_response(std::string_view json) {
    simdjson::dom::parser parser;
    const simdjson::padded_string text(json);
    auto root = parse_document(parser, text, "a filesystem reply");
    if (!root) return std::move(root).error();
    const object top = *root;
    auto entry = field(top, "entry");
    if (!entry) return bad("a filesystem reply without an entry");
    return entry_of(*entry);
}

result<std::vector<entry_info>> parse_list_dir_response(std::string_view json,
                                                        std::size_t max_entries) {
    simdjson::dom::parser parser;
    const simdjson::padded_string text(json);
    auto root = parse_document(parser, text, "a directory listing");
    if (!root) return std::move(root).error();
    const object top = *root;
    std::vector<entry_info> out;
    auto entries = field(top, "entries");
    if (!entries) return out;
    simdjson::dom::array items;
    if (entries->get_array().get(items) != simdjson::SUCCESS)
        return bad("a directory listing whose entries are not an array");
    for (element item : items) {
        if (out.size() == max_entries) {
            return make_error(errc::too_large, "the directory has more than " +
                                                   std::to_string(max_entries) + " entries");
        }
        auto e = entry_of(item);
        if (!e) return std::move(e).error();
        out.push_back(std::move(*e));
    }
    return out;
}

std::string encode_path_request(std::string_view path) {
    json_writer w;
    w.begin_object().key("path").value(path).end_object();
    return w.take();
}

std::string encode_list_dir_request(std::string_view path, std::uint32_t depth) {
    json_writer w;
    w.begin_object().key("path").value(path);
    w.key("depth").value(static_cast<std::uint64_t>(depth)).end_object();
    return w.take();
}

std::string encode_move_request(std::string_view source, std::string_view destination) {
    json_writer w;
    w.begin_object().key("source").value(source).key("destination").value(destination);
    w.end_object();
    return w.take();
}

std::string parse_envd_error_message(std::string_view body) {
    simdjson::dom::parser parser;
    const simdjson::padded_string text(body);
    object o;
    if (parser.parse(text).get_object().get(o) != simdjson::SUCCESS) return {};
    std::string_view message;
    if (o["message"].get_string().get(message) != simdjson::SUCCESS) return {};
    std::string line;
    for (const char c : message) {
        if (c == '\n' || c == '\r' || line.size() == 200) break;
        line.push_back(static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
    }
    return line;
}

namespace {
constexpr std::string_view alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    std::size_t i = 0;
    for (; i + 2 < bytes.size(); i += 3) {
        const std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16 |
                                static_cast<std::uint8_t>(bytes[i + 1]) << 8 |
                                static_cast<std::uint8_t>(bytes[i + 2]);
        out.push_back(alphabet[n >> 18 & 63]);
        out.push_back(alphabet[n >> 12 & 63]);
        out.push_back(alphabet[n >> 6 & 63]);
        out.push_back(alphabet[n & 63]);
    }
    if (i < bytes.size()) {
        std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16;
        if (i + 1 < bytes.size()) n |= static_cast<std::uint8_t>(bytes[i + 1]) << 8;
        out.push_back(alphabet[n >> 18 & 63]);
        out.push_back(alphabet[n >> 12 & 63]);
        out.push_back(i + 1 < bytes.size() ? alphabet[n >> 6 & 63] : '=');
        out.push_back('=');
    }
    return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
    while (!text.empty() && text.back() == '=') text.remove_suffix(1);
    if (text.size() % 4 == 1) return std::nullopt;
    std::string out;
    out.reserve(text.size() * 3 / 4);
    std::uint32_t acc = 0;
    int bits = 0;
    for (const char c : text) {
        const auto at = alphabet.find(c);
        if (at == std::string_view::npos) return std::nullopt;
        acc = (acc << 6) | static_cast<std::uint32_t>(at);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xff));
        }
    }
    return out;
}

std::string percent_encode(std::string_view text) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if ((u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9') ||
            u == '-' || u == '.' || u == '_' || u == '~') {
            out.push_back(c);
        } else {
            out.push_back('%');
            out.push_back(hex[u >> 4]);
            out.push_back(hex[u & 15]);
        }
    }
    return out;
}

}  // namespace moat::e2b
