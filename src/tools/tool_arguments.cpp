#include "tools/tool_arguments.hpp"

#include "core/base64.hpp"

#include <simdjson.h>

#include <cstdint>
#include <cstdio>

namespace moat {
namespace {

error bad(std::string_view field, std::string_view what) {
    std::string detail(field);
    detail += ": ";
    detail += what;
    return make_error(errc::invalid_argument, std::move(detail));
}

const char* type_name(simdjson::dom::element_type type) {
    switch (type) {
        case simdjson::dom::element_type::ARRAY:
            return "an array";
        case simdjson::dom::element_type::OBJECT:
            return "an object";
        case simdjson::dom::element_type::INT64:
        case simdjson::dom::element_type::UINT64:
        case simdjson::dom::element_type::DOUBLE:
            return "a number";
        case simdjson::dom::element_type::STRING:
            return "a string";
        case simdjson::dom::element_type::BOOL:
            return "a boolean";
        case simdjson::dom::element_type::NULL_VALUE:
            return "null";
    }
    return "something else";
}

// A field that is absent or JSON null leaves `out` alone; one of another type is an error.
std::optional<error> read_string(simdjson::dom::object o, std::string_view name, bool required,
                                 std::string& out) {
    simdjson::dom::element e;
    if (o.at_key(name).get(e) != simdjson::SUCCESS || e.is_null()) {
        if (required) return bad(name, "required string is missing");
        return std::nullopt;
    }
    std::string_view value;
    if (e.get_string().get(value) != simdjson::SUCCESS) {
        return bad(name, std::string("must be a string, not ") + type_name(e.type()));
    }
    out.assign(value);
    return std::nullopt;
}

// Program text: a model that sends only whitespace meant something else.
std::optional<error> read_program(simdjson::dom::object o, std::string_view name,
                                  std::string& out) {
    if (auto e = read_string(o, name, true, out)) return e;
    if (out.find_first_not_of(" \t\n\r\f\v") == std::string::npos) return bad(name, "is empty");
    return std::nullopt;
}

std::optional<error> read_timeout(simdjson::dom::object o, double max, std::optional<double>& out) {
    simdjson::dom::element e;
    if (o.at_key("timeout_seconds").get(e) != simdjson::SUCCESS || e.is_null()) {
        return std::nullopt;
    }
    double seconds = 0;
    if (e.is_number() && e.get_double().get(seconds) == simdjson::SUCCESS && seconds > 0 &&
        seconds <= max) {
        out = seconds;
        return std::nullopt;
    }
    char what[96];
    std::snprintf(what, sizeof what, "must be a number greater than 0 and at most %g", max);
    return bad("timeout_seconds", what);
}

std::optional<error> read_encoding(simdjson::dom::object o, bool& base64) {
    std::string encoding;
    if (auto e = read_string(o, "encoding", false, encoding)) return e;
    if (encoding.empty() || encoding == "text") return std::nullopt;
    if (encoding == "base64") {
        base64 = true;
        return std::nullopt;
    }
    return bad("encoding", "must be \"text\" or \"base64\"");
}

// A background process's number: an integer (1, or 1.0 as some clients send it) of at least 1.
std::optional<error> read_id(simdjson::dom::object o, int& out) {
    simdjson::dom::element e;
    if (o.at_key("id").get(e) != simdjson::SUCCESS || e.is_null()) {
        return bad("id", "required integer is missing");
    }
    double value = 0;
    if (!e.is_number() || e.get_double().get(value) != simdjson::SUCCESS || value < 1 ||
        value > 1e9 || value != static_cast<double>(static_cast<int>(value))) {
        return bad("id", "must be an integer of at least 1");
    }
    out = static_cast<int>(value);
    return std::nullopt;
}

// The tool's name for a detail line: bounded, printable ASCII only (it came from a model).
std::string printable(std::string_view s) {
    constexpr std::size_t max_chars = 64;
    std::string out;
    for (const char c : s.substr(0, max_chars)) {
        out += (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    if (s.size() > max_chars) out += "...";
    return out;
}

}  // namespace

result<tool_arguments> parse_tool_arguments(std::string_view tool, std::string_view json,
                                            double max_timeout_seconds) {
    const bool is_python = tool == "run_python";
    const bool is_shell = tool == "run_shell";
    const bool is_write = tool == "write_file";
    const bool is_read = tool == "read_file";
    const bool is_list = tool == "list_files";
    const bool is_start = tool == "start_process";
    const bool is_by_id = tool == "read_process_output" || tool == "stop_process";
    const bool is_processes = tool == "list_processes";
    if (!is_python && !is_shell && !is_write && !is_read && !is_list && !is_start && !is_by_id &&
        !is_processes) {
        return make_error(errc::invalid_argument, "unknown tool '" + printable(tool) + "'");
    }

    // An MCP client may leave arguments out entirely: that is an empty object.
    if (json.find_first_not_of(" \t\n\r") == std::string_view::npos) json = "{}";
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    simdjson::dom::element document;
    if (const auto error = parser.parse(padded).get(document); error != simdjson::SUCCESS) {
        return bad("arguments", "not valid JSON");
    }
    simdjson::dom::object o;
    if (document.get_object().get(o) != simdjson::SUCCESS) {
        return bad("arguments", "not a JSON object");
    }

    tool_arguments args;
    std::optional<error> failed;
    if (is_python) {
        failed = read_program(o, "code", args.code);
        if (!failed) failed = read_timeout(o, max_timeout_seconds, args.timeout_seconds);
    } else if (is_shell) {
        failed = read_program(o, "command", args.command);
        if (!failed) failed = read_timeout(o, max_timeout_seconds, args.timeout_seconds);
    } else if (is_write) {
        failed = read_string(o, "path", true, args.path);
        if (!failed) failed = read_string(o, "content", true, args.content);
        if (!failed) failed = read_encoding(o, args.base64);
        if (!failed && args.base64) {
            auto bytes = base64_decode(args.content);
            if (!bytes) return bad("content", "not valid base64 (encoding is \"base64\")");
            args.content = std::move(*bytes);
        }
    } else if (is_start) {
        failed = read_program(o, "command", args.command);
        if (!failed) failed = read_string(o, "cwd", false, args.cwd);
    } else if (is_by_id) {
        failed = read_id(o, args.id);
    } else if (is_processes) {
        // No arguments.
    } else {
        failed = read_string(o, "path", is_read, args.path);
        if (!failed && is_read) failed = read_encoding(o, args.base64);
    }
    if (failed) return std::move(*failed);
    return args;
}

}  // namespace moat
