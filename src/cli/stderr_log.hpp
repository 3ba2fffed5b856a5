// The long-running commands' log (`moat serve`, `moat mcp`): moat's log records on stderr, one
// line each, from the level MOAT_LOG names (debug, info, warning, error, or off; warning when it
// is unset). stdout stays the commands' own (serve's announcements, mcp's JSON-RPC). Records
// never carry secrets (the library's contract), and they are made terminal-safe: a sandbox id or
// a detail that quotes sandbox output cannot drive the operator's terminal.
#pragma once

#include <string_view>

namespace moat::cli {

// Installs the sink for `command` ("serve", "mcp"). An unknown MOAT_LOG value is a usage error
// (exit 2 with a line naming it).
void install_stderr_log(std::string_view command);

}  // namespace moat::cli
