// What every sandbox subcommand of the CLI shares: running one coroutine against a local backend
// with Ctrl-C wired to cancellation, streaming a command's output to the terminal, printing
// results, and mapping moat errors to exit codes.
#pragma once

#include <moat/backend.hpp>
#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"
#include "cli/terminal_safe.hpp"

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moat::cli {

// Which backend run_with_backend makes: the local one (default state directory), or the e2b one
// (e2b_config_from_environment(): E2B_API_KEY, E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL,
// MOAT_E2B_CA_FILE).
enum class backend_choice { local, e2b };

// "local" or "e2b"; nullopt for anything else.
std::optional<backend_choice> parse_backend_choice(std::string_view name);

// Set once, by main, for the commands that take --backend (the flag wins over MOAT_BACKEND).
// Every other command runs on the local backend.
void select_backend(backend_choice choice);
// The local backend's local_options::network_limit (moat serve: its operator network), so a live
// network update never widens a sandbox past it.
void limit_local_network(sandbox_network limit);

// MOAT_DATA_DIR, or "" (the default data directory, templates.hpp).
std::string data_dir_from_environment();

// Runs `body` on a fresh io_context with the selected backend (local unless select_backend said
// otherwise). SIGINT, SIGTERM and SIGHUP cancel it (terminal cancellation), once. Returns its exit
// code, or exit_failure if it threw. The backend is shut down before returning.
int run_with_backend(const std::function<asio::awaitable<int>(backend&)>& body);

// "moat <command>: <code>: <detail>" on stderr; returns the exit code for that error:
// exit_no_sandbox for sandbox_not_found / sandbox_unavailable, exit_usage for invalid_argument
// and invalid_path, exit_failure otherwise.
int report_error(std::string_view command, const error& e);

// Blocking write of a whole chunk; false if the reader went away.
bool write_all(int fd, std::string_view data);

// Runs a command in `box`: streamed live to stdout/stderr, or with `json` collected (and printed
// by the caller with print_exec_json). Streamed output bound for a terminal goes through
// write_for_terminal unless `raw`.
asio::awaitable<result<exec_result>> exec_for_terminal(std::shared_ptr<sandbox> box,
                                                       exec_request request, bool json,
                                                       bool raw = false);

// Writes sandbox output to `fd` like write_all, with its control characters rendered visibly
// (terminal_safe) when `fd` is a terminal and not `raw`; `safe` carries the state across chunks.
bool write_for_terminal(int fd, std::string_view data, terminal_safe& safe, bool raw);

// For --stdin: reads this process's stdin (up to 10 MiB) into the request. Returns an exit code
// (the error was printed) if it cannot.
std::optional<int> read_stdin_into(std::string_view command, exec_request& request);

// The end of run and exec: the JSON result on stdout when --json asked for it, then the exit code
// (exec_exit_code).
int finish_command(std::string_view command, const std::string& id,
                   const result<exec_result>& outcome, const command_flags& flags);

// run_with_backend(body) for a command that takes command_flags: stdin is read into the request
// first when --stdin asked for it (read_stdin_into; its exit code when that fails).
int run_command_with_backend(std::string_view command, command_flags& flags,
                             const std::function<asio::awaitable<int>(backend&)>& body);

// The signal (SIGINT, SIGTERM, SIGHUP) that cancelled run_with_backend's work, or 0.
int interrupting_signal() noexcept;

// One JSON object with the sandbox id and the result (or the error), then a newline, on stdout.
void print_exec_json(const std::string& id, const result<exec_result>& r);

// A line on stderr when the command was killed at its wall limit or for memory.
void report_exec_end(const exec_result& r, std::chrono::milliseconds wall_limit);

// Exit code for a finished exec: the command's own, 128 + the signal if a signal cancelled it
// (130 for Ctrl-C, 143 for SIGTERM), or what report_error gives (printed unless `json`).
int exec_exit_code(std::string_view command, const result<exec_result>& outcome, bool json,
                   std::chrono::milliseconds wall_limit);

}  // namespace moat::cli
