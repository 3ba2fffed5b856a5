// Parsing a tool call's arguments (a JSON object from a model or an MCP client: untrusted bytes).
// A pure function, unit-tested and fuzzed.
#pragma once

#include <moat/result.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace moat {

// The union of every tool's arguments; which fields are set depends on the tool.
struct tool_arguments {
    std::string code;     // run_python (required; not blank), kept exactly as sent
    std::string command;  // run_shell (required; not blank), kept exactly as sent
    std::string path;     // write_file, read_file (required); list_files (optional: "" if absent).
                          // Any string: the tool layer resolves and checks it.
    std::string content;  // write_file (required; may be ""): the file's bytes, decoded when
                          // encoding is "base64"
    bool base64 = false;  // read_file, write_file: encoding "base64" (optional; "text" if absent)
    std::optional<double> timeout_seconds;  // run_python, run_shell (optional): > 0, <= the max
    std::string cwd;  // start_process (optional; "" if absent), with `command` (required)
    int id = 0;       // read_process_output, stop_process (required): an integer >= 1
};

// Parses `json` as the arguments of `tool` (one of run_python, run_shell, write_file, read_file,
// list_files, start_process, list_processes, read_process_output, stop_process; "id: must be an
// integer of at least 1"). Errors are errc::invalid_argument with a one-line detail that names the
// field and what was wrong: "code: required string is missing", "code: must be a string, not a
// number", "code: is empty" (only whitespace), "timeout_seconds: must be a number greater than 0
// and at most 600", "arguments: not valid JSON", "arguments: not a JSON object", "unknown tool
// 'run_java'" (the name shown bounded and with non-printable bytes replaced). The first problem
// found is reported. Unknown extra fields, and fields of other tools, are ignored; JSON null is
// the same as an absent field; empty (or all-whitespace) `json` is the empty object, as when an
// MCP client leaves arguments out. `max_timeout_seconds` bounds timeout_seconds. read_file and
// write_file take "encoding": "text" (the default) or "base64" ('encoding: must be "text" or
// "base64"'); write_file's base64 content is decoded here ("content: not valid base64", standard
// alphabet, padding optional, whitespace ignored).

result<tool_arguments> parse_tool_arguments(std::string_view tool, std::string_view json,
                                            double max_timeout_seconds = 600);

}  // namespace moat
