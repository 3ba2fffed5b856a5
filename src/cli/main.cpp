// moat: the command-line interface to the moat sandbox runtime.
#include "cli/arguments.hpp"
#include "cli/commands.hpp"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

namespace {

constexpr const char* usage_text =
    "usage: moat <command> [options]\n"
    "\n"
    "commands:\n"
    "  run [--timeout S] [--memory MB] [--pids N] [--env K=V]... [--workdir DIR] [--json] -- "
    "CMD...\n"
    "      run CMD in a fresh sandbox, stream its output, destroy the sandbox, exit with CMD's "
    "code\n"
    "      (124 when --timeout ended it)\n"
    "\n"
    "exit codes: 2 bad usage, 3 moat failed; otherwise the command's own code\n";

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fputs(usage_text, stderr);
        return moat::cli::exit_usage;
    }
    const std::string_view command = argv[1];
    if (command == "--help" || command == "-h" || command == "help") {
        std::fputs(usage_text, stdout);
        return 0;
    }
    try {
        if (command == "run") return moat::cli::run_command(argc - 2, argv + 2);
        std::fprintf(stderr, "moat: unknown command '%s' (see moat --help)\n", argv[1]);
        return moat::cli::exit_usage;
    } catch (const moat::cli::usage_error& e) {
        std::fprintf(stderr, "moat %s: %s\n", argv[1], e.what());
        return moat::cli::exit_usage;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moat %s: %s\n", argv[1], e.what());
        return moat::cli::exit_failure;
    }
}
