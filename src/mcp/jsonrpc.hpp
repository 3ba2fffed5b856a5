// JSON-RPC 2.0 messages as MCP sends them over stdio: one JSON object per line. Parsing is a pure
// function over untrusted bytes (unit-tested and fuzzed); writing builds one line of JSON.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace moat::mcp {

struct jsonrpc_message {
    enum class kind {
        request,       // has an id and a method
        notification,  // has a method and no id
        response,      // has an id and a result or an error (a reply to something we sent)
        invalid,       // not a JSON-RPC 2.0 message: see error_code / error_message
    };
    kind what = kind::invalid;
    std::string id;      // the id as JSON text (a number like 7 or a string like "7"), "" if none
    std::string method;  // requests and notifications
    std::string params;  // the params object or array as JSON text; "" when absent
    // For kind::invalid: the JSON-RPC error to answer with (-32700 parse error, -32600 invalid
    // request) and a one-line message. When the line had a usable id, `id` is set so the error
    // response can name it; otherwise the response's id is null.
    int error_code = 0;
    std::string error_message;
};

// Parses one line (without its '\n'). Any input gives a message of some kind; the only exception
// that can escape is std::bad_alloc. Accepts at most `max_bytes` (longer lines are invalid with
// -32600 and "message too large"). The rules:
//   - not JSON (including integers beyond 64 bits, which simdjson does not read): -32700;
//   - a JSON array (a batch; MCP 2025-06-18 removed them): -32600 "batches are not supported";
//   - anything but an object, "jsonrpc" other than "2.0", a method that is not a string, params
//     that are neither an object nor an array (null included): -32600;
//   - an id must be an integer or a string (a fraction, a boolean, ... is -32600 without an id);
//     a request's id must not be null;
//   - with a method it is a request (id present) or a notification (no id); without a method but
//     with exactly one of result/error and an id, a response (an error's id may be null, then
//     `id` is ""). Other members are ignored; with a duplicated member the first one counts.
// `params` is the params value re-serialized compactly (equal as JSON, not byte for byte).
jsonrpc_message parse_jsonrpc(std::string_view line, std::size_t max_bytes = 64 << 20);

// One line of JSON (no trailing newline). `id_json` is an id as parse_jsonrpc returns it, or ""
// for null. `result_json`/`params_json` are JSON text written as is (the caller makes sure they
// are valid JSON); an empty `result_json` is written as {} and an empty `params_json` leaves
// params out. `method` and `message` are escaped.
std::string jsonrpc_result(std::string_view id_json, std::string_view result_json);
std::string jsonrpc_error(std::string_view id_json, int code, std::string_view message);
std::string jsonrpc_notification(std::string_view method, std::string_view params_json);

// Reads fields out of a params object (JSON text) without a full schema: each returns nullopt
// when `params_json` is not a JSON object, the field is absent, or (string_field) it is not a
// string. Each call parses `params_json` again: meant for the few fields of a small object.
std::optional<std::string> string_field(std::string_view params_json, std::string_view name);
// The field's JSON text, re-serialized compactly (object, array, number, string with quotes,
// null, ...).
std::optional<std::string> raw_field(std::string_view params_json, std::string_view name);

}  // namespace moat::mcp
