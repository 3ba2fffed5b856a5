// What `moat --help`, `moat help [CMD]`, `moat CMD --help` and `moat --version` print.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace moat::cli {

// Every command, the notes on backends and exit codes.
std::string full_usage();

// The part of the usage for `command` (its lines, the network flags where it takes them, and
// the notes); nullopt for a name that is not a command.
std::optional<std::string> command_usage(std::string_view command);

// "moat 0.1.0 (helper wire protocol 7)\n".
std::string version_text();

// True when the arguments after the command (before a "--") ask for help: --help or -h.
bool asks_for_help(int argc, char** argv);

}  // namespace moat::cli
