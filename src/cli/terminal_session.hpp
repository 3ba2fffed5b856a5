// moat exec -t / -it and moat run -t / -it: a command on a terminal of the sandbox's own
// (terminal.hpp), with this process's terminal as its window.
//
// -it: stdin must be a terminal (else a usage error, as docker says "the input device is not a
// TTY"). It is put in raw mode for the session and restored on every way out: the command's end,
// the sandbox ending under it, SIGTERM or SIGHUP (they cancel the session; the command is
// killed), an error. Every byte typed goes to the sandbox's terminal, Ctrl-C and Ctrl-Z included
// (they act there, on its foreground job, and never on moat); window-size changes (SIGWINCH)
// resize it. -t alone: the command gets a terminal of this window's size (24x80 when stdout is
// no terminal) but no input, and Ctrl-C cancels moat as for any exec.
// The exit code is the command's; the wall limit is exec_request::max_spawn_wall_limit unless
// --timeout says otherwise.
#pragma once

#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"

#include <asio/awaitable.hpp>

#include <memory>
#include <optional>

namespace moat::cli {

// A usage error for flags that do not go with -t (--json, --stdin, -i on a stdin that is no
// terminal), or nullopt. Call before anything starts.
std::optional<std::string> terminal_flags_problem(const command_flags& flags);

// Runs the command of `flags` in `box`: on a terminal when flags.terminal, else as
// exec_for_terminal does.
asio::awaitable<result<exec_result>> run_in_box(std::shared_ptr<sandbox> box,
                                                const command_flags& flags);

}  // namespace moat::cli
