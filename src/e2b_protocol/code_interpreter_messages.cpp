#include "e2b_protocol/code_interpreter_messages.hpp"

#include "core/ascii.hpp"
#include "core/json_writer.hpp"
#include "core/rfc3339.hpp"
#include "e2b_protocol/json_fields.hpp"

namespace moat::e2b_protocol {
namespace {

using detail::document;
using detail::field;
using detail::parse_document;

error invalid(std::string detail) {
    return make_error(errc::invalid_argument, std::move(detail));
}

// An optional string field: "" when absent or null.
result<std::string> optional_string(const simdjson::dom::object& o, const char* name) {
    const auto e = field(o, name);
    if (!e) return std::string();
    std::string_view v;
    if (e->get_string().get(v) != simdjson::SUCCESS) {
        return invalid(std::string("'") + name + "' must be a string");
    }
    return std::string(v);
}

result<document*> parse_body(std::string_view body, std::size_t cap, document& doc,
                             const char* what) {
    if (body.size() > cap) {
        return invalid(std::string(what) + " is over " + std::to_string(cap) + " bytes");
    }
    if (!parse_document(body, doc)) {
        return invalid(std::string(what) + " is not a JSON object");
    }
    return &doc;
}

// `text` as one line of JSON when it is a JSON object, else "".
std::string minified_object(std::string_view text) {
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    const simdjson::padded_string padded(text);
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) return {};
    return simdjson::minify(o);
}

std::string line(json_writer& w) {
    std::string out = w.take();
    out += '\n';
    return out;
}

}  // namespace

std::string normalize_language(std::string_view language) {
    if (language.size() > 64) return {};
    std::string lower = moat::detail::ascii_lowered(language);
    const auto first = lower.find_first_not_of(" \t");
    if (first == std::string::npos) return "python";
    lower = lower.substr(first, lower.find_last_not_of(" \t") - first + 1);
    if (lower == "js") return "javascript";
    if (lower == "ts") return "typescript";
    return lower;
}

result<execute_request> parse_execute_request(std::string_view body) {
    document doc;
    auto parsed = parse_body(body, max_execute_body_bytes, doc, "the execute request");
    if (!parsed) return std::move(parsed).error();
    execute_request r;
    const auto code = field(doc.root, "code");
    std::string_view text;
    if (!code || code->get_string().get(text) != simdjson::SUCCESS) {
        return invalid("'code' must be a string");
    }
    r.code = std::string(text);
    auto context = optional_string(doc.root, "context_id");
    if (!context) return std::move(context).error();
    r.context_id = std::move(*context);
    auto language = optional_string(doc.root, "language");
    if (!language) return std::move(language).error();
    r.language = std::move(*language);
    if (const auto envs = field(doc.root, "env_vars")) {
        simdjson::dom::object o;
        if (envs->get_object().get(o) != simdjson::SUCCESS) {
            return invalid("'env_vars' must be an object of strings");
        }
        for (auto entry : o) {
            std::string_view v;
            if (entry.value.get_string().get(v) != simdjson::SUCCESS) {
                return invalid("'env_vars' must be an object of strings");
            }
            if (r.env_vars.size() >= max_env_var_entries) {
                return invalid("'env_vars' has more than " + std::to_string(max_env_var_entries) +
                               " entries");
            }
            r.env_vars[std::string(entry.key)] = std::string(v);
        }
    }
    return r;
}

std::string encode_execute_request(const execute_request& r) {
    json_writer w;
    w.begin_object();
    w.key("code").value(r.code);
    if (!r.context_id.empty()) w.key("context_id").value(r.context_id);
    if (!r.language.empty()) w.key("language").value(r.language);
    if (!r.env_vars.empty()) {
        w.key("env_vars").begin_object();
        for (const auto& [k, v] : r.env_vars) w.key(k).value(v);
        w.end_object();
    }
    w.end_object();
    return w.take();
}

result<context_request> parse_context_request(std::string_view body) {
    context_request r;
    // The SDK always sends a body; a client that sends none asks for the defaults.
    if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return r;
    document doc;
    auto parsed = parse_body(body, max_context_body_bytes, doc, "the context request");
    if (!parsed) return std::move(parsed).error();
    auto language = optional_string(doc.root, "language");
    if (!language) return std::move(language).error();
    r.language = std::move(*language);
    auto cwd = optional_string(doc.root, "cwd");
    if (!cwd) return std::move(cwd).error();
    r.cwd = std::move(*cwd);
    return r;
}

namespace {

void write_context(json_writer& w, const context_info& c) {
    w.begin_object();
    w.key("id").value(c.id);
    w.key("language").value(c.language);
    w.key("cwd").value(c.cwd);
    w.end_object();
}

}  // namespace

std::string encode_context(const context_info& context) {
    json_writer w;
    write_context(w, context);
    return w.take();
}

std::string encode_context_list(const std::vector<context_info>& contexts) {
    json_writer w;
    w.begin_array();
    for (const auto& c : contexts) write_context(w, c);
    w.end_array();
    return w.take();
}

std::string encode_stream_line(bool is_stderr, std::string_view text,
                               std::chrono::system_clock::time_point at) {
    json_writer w;
    w.begin_object();
    w.key("type").value(is_stderr ? "stderr" : "stdout");
    w.key("text").value(text);
    w.key("timestamp").value(moat::detail::format_rfc3339(at));
    w.end_object();
    return line(w);
}

std::string_view result_format_name(std::string_view media_type) {
    static constexpr std::pair<std::string_view, std::string_view> names[] = {
        {"text/plain", "text"},        {"text/html", "html"},
        {"text/markdown", "markdown"}, {"image/svg+xml", "svg"},
        {"image/png", "png"},          {"image/jpeg", "jpeg"},
        {"application/pdf", "pdf"},    {"text/latex", "latex"},
        {"application/json", "json"},  {"application/javascript", "javascript"},
        {"e2b/data", "data"},          {"e2b/chart", "chart"},
    };
    for (const auto& [type, name] : names) {
        if (type == media_type) return name;
    }
    return media_type;
}

std::string encode_result_line(
    const std::vector<std::pair<std::string, std::string>>& representations, bool is_main_result) {
    json_writer w;
    w.begin_object();
    w.key("type").value("result");
    for (const auto& [media_type, data] : representations) {
        const auto name = result_format_name(media_type);
        // "type" and "is_main_result" are the line's own keys: a media type spelled so is dropped.
        if (name == "type" || name == "is_main_result") continue;
        w.key(name);
        if (name == "text" && data.size() >= 2 && data.front() == '\'' && data.back() == '\'') {
            w.value(std::string_view(data).substr(1, data.size() - 2));
            continue;
        }
        // Structured formats are JSON objects on the wire (one line: minified).
        std::string object;
        if (name == "json" || name == "data" || name == "chart") object = minified_object(data);
        if (!object.empty()) {
            w.raw_value(object);
        } else {
            w.value(data);
        }
    }
    w.key("is_main_result").value(is_main_result);
    w.end_object();
    return line(w);
}

std::string encode_error_line(std::string_view name, std::string_view value,
                              std::string_view traceback) {
    json_writer w;
    w.begin_object();
    w.key("type").value("error");
    w.key("name").value(name);
    w.key("value").value(value);
    w.key("traceback").value(traceback);
    w.end_object();
    return line(w);
}

std::string encode_execution_count_line(std::uint64_t count) {
    json_writer w;
    w.begin_object();
    w.key("type").value("number_of_executions");
    w.key("execution_count").value(count);
    w.end_object();
    return line(w);
}

std::string encode_end_line() {
    return "{\"type\":\"end_of_execution\"}\n";
}

std::string encode_keepalive_line() {
    return "{\"type\":\"keepalive\"}\n";
}

}  // namespace moat::e2b_protocol
