// The JSON messages of envd's process service (package `process`, proto3 JSON as connect-es
// writes it), parsed from untrusted bytes and written for the official SDK. Pure functions:
// unit-tested in tests/serve_process_table_test.cpp.
//
// Parsing follows the proto3 JSON mapping where the SDK or another client can differ: a field
// may be absent or null (its default), a uint32 may be a number or a decimal string, an enum a
// name or its number, `bytes` standard base64; unknown fields are ignored. Every error is
// errc::invalid_argument with a detail naming the field.
#pragma once

#include "serve/process_table.hpp"

#include <moat/exec.hpp>
#include <moat/result.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::serve {

// process.StartRequest: {"process":{"cmd","args","envs","cwd"},"pty"?,"tag"?,"stdin"?}.
struct start_request {
    process_config process;  // cmd is required and non-empty
    bool has_pty = false;    // a "pty" object was sent
    std::optional<std::string> tag;
    bool stdin_open = true;  // an absent "stdin" means true (envd's legacy default)
};
result<start_request> parse_start_request(std::string_view json);

// {"process": ProcessSelector, ...}: Connect, CloseStdin, and the selector of the others. A
// selector with neither "pid" nor "tag" is an error.
result<process_selector> parse_selector_request(std::string_view json);

// process.SendInputRequest: {"process":..., "input":{"stdin":b64} | {"pty":b64}}.
struct send_input_request {
    process_selector process;
    std::string bytes;
    bool is_pty = false;
};
result<send_input_request> parse_send_input_request(std::string_view json);

// process.SendSignalRequest: {"process":..., "signal":"SIGNAL_SIGKILL"}. `signal` is the POSIX
// number for SIGNAL_SIGKILL (9) and SIGNAL_SIGTERM (15), and 0 for anything else (envd answers
// unimplemented); `name` is what was sent, for that message.
struct send_signal_request {
    process_selector process;
    int signal = 0;
    std::string name;
};
result<send_signal_request> parse_send_signal_request(std::string_view json);

// process.UpdateRequest: {"process":..., "pty"?:{"size":{...}}}.
struct update_request {
    process_selector process;
    bool has_pty = false;
};
result<update_request> parse_update_request(std::string_view json);

// The stream messages ({"event":{...}}) and List's response.
std::string encode_start_event(std::uint32_t pid);
std::string encode_data_event(output_channel channel, std::string_view bytes);
// exitCode omitted when 0, exited when false, error when absent (proto3 JSON omits defaults).
std::string encode_end_event(const process_end& end);
std::string encode_keepalive_event();
// {"processes":[{"config":{...},"pid":N,"tag"?:...}]}: config always present (the SDK reads it).
std::string encode_list_response(const std::vector<process_info>& processes);

}  // namespace moat::serve
