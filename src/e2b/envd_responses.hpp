// The messages envd's client side writes and reads: the process service's Start request and its
// stream events, the unary requests (SendInput, SendSignal, CloseStdin, List), the filesystem
// service's EntryInfo (Stat, ListDir, Move), and envd's HTTP error bodies (/files).
//
// Parsers take untrusted bytes from the network and follow proto3 JSON as connect-go and
// protobuf-es write it: absent or null fields are their defaults, unknown fields are ignored,
// int64 and uint32 arrive as numbers or decimal strings, enums as names or numbers, bytes as
// standard base64. Anything else is errc::protocol_error with a detail naming the field. Pure
// functions, unit-tested in tests/e2b_envd_test.cpp and fuzzed (fuzz/envd_response_fuzzer.cpp).
#pragma once

#include <moat/exec.hpp>
#include <moat/files.hpp>
#include <moat/result.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace moat::e2b {

// --- the process service ---

struct start_event {
    std::uint32_t pid = 0;
};
struct data_event {
    output_channel channel = output_channel::out;
    std::string bytes;  // decoded
};
// Go's os.ProcessState as envd reports it: exitCode (-1 when a signal ended it), exited, status
// ("exit status 3", "signal: killed"), error (set for a non-zero exit or a signal).
struct end_event {
    int exit_code = 0;
    bool exited = false;
    std::string status;
    std::string error;
};
struct keepalive_event {};

using process_event = std::variant<start_event, data_event, end_event, keepalive_event>;

// One stream message, {"event":{"start"|"data"|"end"|"keepalive":{...}}}. A data event that
// carries pty bytes only is protocol_error (moat never asks for a PTY).
result<process_event> parse_process_event(std::string_view json);

// What an end event means for moat's exec_result: exit_code and signal (exit_code 128 + signal
// when a signal ended it, the signal's number parsed from Go's name in "signal: <name>", SIGKILL
// when the name is unknown). timed_out, duration and output are the caller's to fill.
exec_result result_from_end(const end_event& end);

// process.StartRequest: {"process":{"cmd","args","envs","cwd"?},"tag":...,"stdin":bool}. The tag
// names the command before its pid is known (a kill after a cancelled Start uses it).
std::string encode_start_request(const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& env,
                                 const std::string& cwd, const std::string& tag, bool stdin_open);
// {"process":{"pid":N}}: Connect and CloseStdin.
std::string encode_selector_request(std::uint32_t pid);
// {"process":{"pid":N},"input":{"stdin":"<base64>"}}.
std::string encode_send_input_request(std::uint32_t pid, std::string_view bytes);
// {"process":{"pid":N},"signal":"SIGNAL_SIGKILL"}; envd names only SIGKILL and SIGTERM, so
// nullopt for any other signal.
std::optional<std::string> encode_send_signal_request(std::uint32_t pid, int signal);
// The same with {"process":{"tag":"..."}}.
std::optional<std::string> encode_send_signal_by_tag(std::string_view tag, int signal);

// process.ListResponse: the running processes, their pids and tags ("" when none).
struct listed_process {
    std::uint32_t pid = 0;
    std::string tag;
};
result<std::vector<listed_process>> parse_list_response(std::string_view json);

// --- the filesystem service ---

// filesystem.EntryInfo, the fields moat uses.
struct entry_info {
    std::string name;
    std::string path;
    // FILE_TYPE_FILE → regular, _DIRECTORY → directory, _SYMLINK → symlink, anything else
    // (UNSPECIFIED: a FIFO, a device, a dangling link) → other.
    file_type type = file_type::other;
    std::uint64_t size = 0;
    std::uint32_t mode = 0;  // permission bits (07777), from Go's FileMode or plain octal bits
    std::optional<std::string> symlink_target;
    // "metadata": the file's user-defined metadata (envd 0.6.2 and later), as sent; entries
    // that break moat's metadata rules (files.hpp) are left out.
    file_metadata metadata;
};

// {"entry": EntryInfo}: Stat, Move, MakeDir.
result<entry_info> parse_entry_response(std::string_view json);
// {"entries": [EntryInfo]}: ListDir. More than `max_entries` entries is too_large.
result<std::vector<entry_info>> parse_list_dir_response(std::string_view json,
                                                        std::size_t max_entries);

// {"path":"..."}; {"path":"...","depth":N}; {"source":"...","destination":"..."}.
std::string encode_path_request(std::string_view path);
std::string encode_list_dir_request(std::string_view path, std::uint32_t depth);
std::string encode_move_request(std::string_view source, std::string_view destination);

// --- envd's HTTP errors (/files) ---

// envd's {"code":<int>,"message":"..."}: the message, or "" when the body is not that shape.
// The message is cut to one line of at most 200 bytes.
std::string parse_envd_error_message(std::string_view body);

// --- helpers ---

std::string base64_encode(std::string_view bytes);
// Standard alphabet, padding optional; nullopt for anything else.
std::optional<std::string> base64_decode(std::string_view text);
// Percent-encodes everything but RFC 3986 unreserved characters (for a query value).
std::string percent_encode(std::string_view text);

}  // namespace moat::e2b
