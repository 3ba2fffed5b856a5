// Parsing of command-line values. Each parser returns nullopt for anything it does not accept
// whole (no trailing junk, no sign where none belongs, no overflow).
#pragma once

#include <moat/exec.hpp>
#include <moat/sandbox_spec.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace moat::cli {

// Exit codes of the CLI itself; a command's own exit code passes through unchanged.
inline constexpr int exit_usage = 2;       // bad flags or values
inline constexpr int exit_failure = 3;     // moat could not do what was asked
inline constexpr int exit_no_sandbox = 4;  // no such sandbox, or it has ended (expired, destroyed)
inline constexpr int exit_interrupted = 130;  // Ctrl-C: the command was killed

// A usage error: printed as "moat: <message>" with exit code exit_usage.
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::optional<std::uint64_t> parse_unsigned(std::string_view text);

// A whole number from `min` to `max` for `flag`; throws usage_error "<flag>: expected <min> to
// <max>" otherwise.
std::uint64_t parse_count(std::string_view flag, std::string_view text, std::uint64_t min,
                          std::uint64_t max);

// Decimal seconds ("2", "0.5"); strictly positive.
std::optional<std::chrono::milliseconds> parse_seconds(std::string_view text);

// "K=V" with a non-empty K; throws usage_error naming `flag` otherwise.
std::pair<std::string, std::string> parse_key_value(std::string_view flag, std::string_view text);

// A sandbox limit in megabytes (at least 16) as bytes; throws usage_error naming `flag`.
std::uint64_t parse_megabytes(std::string_view flag, std::string_view text);

// A command's wall limit in seconds (0.001 to 600); throws usage_error naming `flag` otherwise.
std::chrono::milliseconds parse_wall_limit(std::string_view flag, const std::string& text);

// An absolute path for `flag` (--workdir); throws usage_error naming `flag` otherwise.
std::string parse_absolute_path(std::string_view flag, const std::string& text);

// A flag that takes a value, and what to do with the value (throwing usage_error to refuse it).
struct flag_handler {
    std::string_view name;
    std::function<void(const std::string& value)> apply;
};
// The value as a string; as a count from `min` to `max` (parse_count).
flag_handler string_flag(std::string_view name, std::string& into);
flag_handler count_flag(std::string_view name, std::size_t& into, std::uint64_t min,
                        std::uint64_t max);

// Applies each "--flag value" or "--flag=value" of argv[0..argc) to its handler, in order;
// throws usage_error for a flag without its value and for any other argument.
void parse_flags(int argc, char** argv, std::initializer_list<flag_handler> handlers);

// "--flag=value" or "--flag value": the value for `flag` at argv[i], advancing i past it.
// nullopt if argv[i] is not this flag; throws usage_error if the value is missing.
std::optional<std::string> flag_value(std::string_view flag, int argc, char** argv, int& i);

// The flags moat run and moat exec share: --json, --raw (control characters reach a terminal
// unchanged), --stdin (this process's stdin, up to 10 MiB, feeds the command), --timeout SECONDS
// and --env K=V (repeatable) into the request.
struct command_flags {
    exec_request request;
    bool json = false;
    bool raw = false;
    bool read_stdin = false;
    // -t: the command runs on a terminal of the sandbox's own; with -i (-it) this process's
    // terminal is its terminal (terminal_session.hpp). -i alone reads stdin like --stdin.
    bool terminal = false;
    bool interactive = false;
    bool wall_limit_set = false;  // --timeout was given
};

// Consumes the command flag at argv[i] (advancing i past its value); false if argv[i] is none.
bool command_flag(int argc, char** argv, int& i, command_flags& flags);

// The sandbox flags moat run and moat create share: --memory MB, --env K=V (repeatable: the
// sandbox's environment), --workdir PATH and --allow-sudo (sandbox_spec::allow_sudo). Consumes the
// one at argv[i] into `spec` (advancing i past its value); false if argv[i] is none.
bool spec_flag(int argc, char** argv, int& i, sandbox_spec& spec);

// The network flags of run, create, mcp and session exec (docs/network.md): --allow-host PATTERN,
// --resolve NAME=ADDR and --allow-address CIDR (each repeatable), --network all|none.
struct network_flags {
    sandbox_network network;
    bool all = false;   // --network all
    bool none = false;  // --network none
};

// Consumes the network flag at argv[i] (advancing i past its value); false if argv[i] is none.
bool network_flag(int argc, char** argv, int& i, network_flags& flags);

// The sandbox_network the flags ask for, validated as a create would validate it; throws
// usage_error with one line naming the bad flag or entry.
sandbox_network finish_network(const network_flags& flags);

}  // namespace moat::cli
