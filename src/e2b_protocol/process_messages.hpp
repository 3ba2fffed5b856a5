// envd's process service (package `process`, proto3 JSON as connect-es and connect-go write it):
// the Start request, the selector of Connect and CloseStdin, SendInput, SendSignal, Update, the
// stream's events (start, data, end, keepalive) and List's response. Each has one struct, one
// writer and one parser; the e2b backend's envd client writes the requests and reads the events,
// moat serve the other way round. Unit-tested in tests/e2b_protocol_test.cpp and fuzzed
// (fuzz/process_request_fuzzer.cpp, fuzz/envd_response_fuzzer.cpp).
//
// Parsing follows the proto3 JSON mapping where a client or server can differ: a field may be
// absent or null (its default), an integer a number or a decimal string, an enum a name or its
// number, `bytes` standard base64 (core/base64.hpp); unknown fields are ignored. A request parser
// fails with errc::invalid_argument (moat serve answers invalid_argument with it), a parser of
// what envd sends with errc::protocol_error; the detail names the field, never its value.
#pragma once

#include <moat/exec.hpp>
#include <moat/result.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace moat::e2b_protocol {

// envd's ProcessConfig: what a process is started with, as List reports it.
struct process_config {
    std::string cmd;
    std::vector<std::string> args;
    std::map<std::string, std::string> envs;
    std::string cwd;  // "" is written as absent
};

// ProcessSelector: a process by pid, or by the tag it was started with.
struct process_selector {
    std::optional<std::uint32_t> pid;
    std::optional<std::string> tag;
};

// PTY: {"size":{"cols":u32,"rows":u32}}. A pty object without a size (or a side 0) is parsed as
// 0, which moat serve reads as envd's default; a side above 4096 is invalid_argument.
struct pty_size {
    std::uint32_t cols = 0;
    std::uint32_t rows = 0;
};

// process.StartRequest: {"process":{"cmd","args","envs","cwd"?},"pty"?,"tag"?,"stdin"?}. The tag
// names the command before its pid is known (a kill after a cancelled Start uses it).
struct start_request {
    process_config process;  // cmd is required and non-empty
    bool has_pty = false;    // a "pty" object was sent (written with its size when not 0)
    pty_size pty;
    std::optional<std::string> tag;
    bool stdin_open = true;  // an absent "stdin" means true (envd's legacy default)
};
std::string encode_start_request(const start_request& request);
result<start_request> parse_start_request(std::string_view json);

// {"process": ProcessSelector}: Connect and CloseStdin (and the selector of the calls below). A
// selector with neither "pid" nor "tag" is an error.
std::string encode_selector_request(const process_selector& process);
result<process_selector> parse_selector_request(std::string_view json);

// process.SendInputRequest: {"process":..., "input":{"stdin":b64} | {"pty":b64}}.
struct send_input_request {
    process_selector process;
    std::string bytes;  // decoded
    bool is_pty = false;
};
std::string encode_send_input_request(const send_input_request& request);
result<send_input_request> parse_send_input_request(std::string_view json);

// process.SendSignalRequest: {"process":..., "signal":"SIGNAL_SIGKILL"}. `signal` is the POSIX
// number for SIGNAL_SIGKILL (9) and SIGNAL_SIGTERM (15), and 0 for anything else (envd answers
// unimplemented); `name` is what was sent, for that message. envd names only those two signals,
// so the writer answers nullopt for any other.
struct send_signal_request {
    process_selector process;
    int signal = 0;
    std::string name;
};
std::optional<std::string> encode_send_signal_request(const send_signal_request& request);
result<send_signal_request> parse_send_signal_request(std::string_view json);

// process.UpdateRequest: {"process":..., "pty"?:{"size":{...}}} (a terminal's resize; only moat
// serve reads it).
struct update_request {
    process_selector process;
    bool has_pty = false;
    pty_size pty;
};
result<update_request> parse_update_request(std::string_view json);

// --- the stream's events: {"event":{"start"|"data"|"end"|"keepalive":{...}}} ---

struct start_event {
    std::uint32_t pid = 0;
};
struct data_event {
    output_channel channel = output_channel::out;
    std::string bytes;  // decoded
};
// Go's os.ProcessState as envd reports it: exitCode (-1 when a signal ended it), exited, status
// ("exit status 3", "signal: killed"), error (what cmd.Wait() returned: set for a non-zero exit
// or a signal, absent for exit status 0). exitCode is written only when not 0, exited only when
// true (proto3 JSON omits defaults).
struct end_event {
    int exit_code = 0;
    bool exited = false;
    std::string status;
    std::optional<std::string> error;
};
struct keepalive_event {};

using process_event = std::variant<start_event, data_event, end_event, keepalive_event>;

std::string encode_start_event(std::uint32_t pid);
std::string encode_data_event(output_channel channel, std::string_view bytes);
// {"event":{"data":{"pty":b64}}}: a terminal's output.
std::string encode_pty_data_event(std::string_view bytes);
std::string encode_end_event(const end_event& end);
std::string encode_keepalive_event();
// One stream message. A data event that carries pty bytes only is protocol_error (moat never
// asks for a PTY).
result<process_event> parse_process_event(std::string_view json);

// What an end event means for moat's exec_result: exit_code and signal (exit_code 128 + signal
// when a signal ended it, the signal's number parsed from Go's name in "signal: <name>", SIGKILL
// when the name is unknown). timed_out, duration and output are the caller's to fill.
exec_result result_from_end(const end_event& end);

// --- List ---

// process.ListResponse's entries: {"processes":[{"config":{...},"pid":N,"tag"?:...}]} (the
// writer always writes config: the SDK reads it).
struct listed_process {
    std::uint32_t pid = 0;
    process_config config;
    std::optional<std::string> tag;
};
std::string encode_list_response(const std::vector<listed_process>& processes);
result<std::vector<listed_process>> parse_list_response(std::string_view json);

}  // namespace moat::e2b_protocol
