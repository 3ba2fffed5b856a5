// E2B's Code Interpreter protocol, the HTTP API on port 49999 of a sandbox that
// `@e2b/code-interpreter` (runCode, the code contexts) talks to: the requests' bodies, the NDJSON
// lines of an execution's answer, and the context objects. One struct, writer or parser each;
// pure functions, unit-tested in tests/e2b_protocol_test.cpp and fuzzed
// (fuzz/e2b_request_fuzzer.cpp).
//
// What the SDK sends and reads (e2b-dev/code-interpreter's template server and the SDK 2.8.0):
//
//   POST /execute          {code, context_id?, language?, env_vars?}  ->  200, NDJSON lines
//   POST /contexts         {language?, cwd?}                           ->  {id, language, cwd}
//   GET /contexts                                                       ->  [{id, language, cwd}]
//   DELETE /contexts/{id}, POST /contexts/{id}/restart                  ->  2xx
//
// A body that does not validate is 422 (FastAPI's answer for any body its model refuses, bad JSON
// included); a request naming both a context and a language is 400. The parsers fail with
// errc::invalid_argument and a detail naming the field, never its value.
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moat::e2b_protocol {

// Where the SDK reaches the interpreter: a port of the sandbox (getHost(49999), or the
// E2b-Sandbox-Port header).
inline constexpr std::uint16_t code_interpreter_port = 49999;

// Caps on what a client sends: a body, and the entries of env_vars.
inline constexpr std::size_t max_execute_body_bytes = 8 * 1024 * 1024;
inline constexpr std::size_t max_context_body_bytes = 64 * 1024;
inline constexpr std::size_t max_env_var_entries = 1024;

// The name a language is known by: "" (absent) is python, "js" javascript, "ts" typescript;
// others lower case, as given (at most 64 bytes; longer is returned empty: no such language).
std::string normalize_language(std::string_view language);

struct execute_request {
    std::string code;
    std::string context_id;  // "" when absent
    std::string language;    // "" when absent; as sent (normalize_language is the caller's)
    std::map<std::string, std::string> env_vars;
};
result<execute_request> parse_execute_request(std::string_view body);
std::string encode_execute_request(const execute_request& request);

struct context_request {
    std::string language;  // "" when absent
    std::string cwd;       // "" when absent
};
result<context_request> parse_context_request(std::string_view body);

struct context_info {
    std::string id;
    std::string language;
    std::string cwd;
};
std::string encode_context(const context_info& context);
std::string encode_context_list(const std::vector<context_info>& contexts);

// The lines of an execution's answer, each a JSON object and a "\n".
//
// Output as it arrives: {"type":"stdout"|"stderr","text":...,"timestamp":"<RFC 3339>"}.
std::string encode_stream_line(bool is_stderr, std::string_view text,
                               std::chrono::system_clock::time_point at);
// A display result: {"type":"result", <format>: <data>..., "is_main_result": bool}. Each
// representation is a media type and its data as Jupyter carries it (images base64). The known
// media types take E2B's names (text/plain: "text", with one pair of enclosing single quotes
// dropped as E2B's server does; text/html: "html"; text/markdown: "markdown"; image/svg+xml:
// "svg"; image/png: "png"; image/jpeg: "jpeg"; application/pdf: "pdf"; text/latex: "latex";
// application/json: "json", written as the JSON value it holds when that is an object, else
// as a string; application/javascript: "javascript"; e2b/data and e2b/chart: "data", "chart");
// any other goes under its media type, which the SDK collects as extra.
std::string encode_result_line(
    const std::vector<std::pair<std::string, std::string>>& representations, bool is_main_result);
// {"type":"error","name":...,"value":...,"traceback":...}
std::string encode_error_line(std::string_view name, std::string_view value,
                              std::string_view traceback);
// {"type":"number_of_executions","execution_count":N}
std::string encode_execution_count_line(std::uint64_t count);
// {"type":"end_of_execution"} (the last line) and {"type":"keepalive"} (after a quiet while).
std::string encode_end_line();
std::string encode_keepalive_line();

// The E2B name of a representation's media type (see encode_result_line), or the media type.
std::string_view result_format_name(std::string_view media_type);

}  // namespace moat::e2b_protocol
