// moat: the command-line interface to the moat sandbox runtime.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/usage.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

// The commands that run on a selectable backend (bench only for `bench create`).
bool takes_backend(std::string_view command, int argc, char** argv) {
    static constexpr std::string_view names[] = {
        "run",       "create",  "exec",  "cp",     "destroy", "ls",      "pause",  "resume",
        "inventory", "janitor", "smoke", "doctor", "mcp",     "session", "network"};
    for (const auto name : names) {
        if (command == name) return true;
    }
    return command == "bench" && argc > 2 && std::string_view(argv[2]) == "create";
}

// Takes --backend NAME / --backend=NAME out of the arguments (before a "--") and selects it,
// else MOAT_BACKEND's value. Throws usage_error for a name that is not a backend.
void select_backend_from(std::vector<char*>& args) {
    std::optional<std::string> chosen;
    std::string from = "--backend";
    for (std::size_t i = 2; i < args.size();) {
        const std::string_view arg = args[i];
        if (arg == "--") break;
        if (arg == "--backend") {
            if (i + 1 >= args.size()) throw moat::cli::usage_error("--backend needs local or e2b");
            chosen = args[i + 1];
            args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                       args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
        } else if (arg.starts_with("--backend=")) {
            chosen = std::string(arg.substr(10));
            args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
            ++i;
        }
    }
    if (!chosen) {
        const char* env = std::getenv("MOAT_BACKEND");
        if (env == nullptr || *env == '\0') return;
        chosen = env;
        from = "MOAT_BACKEND";
    }
    const auto choice = moat::cli::parse_backend_choice(*chosen);
    if (!choice) {
        throw moat::cli::usage_error(from + ": '" + *chosen + "' is not a backend (local or e2b)");
    }
    moat::cli::select_backend(*choice);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fputs(moat::cli::full_usage().c_str(), stderr);
        return moat::cli::exit_usage;
    }
    const std::string_view command = argv[1];
    if (command == "--version" || command == "-V" || command == "version") {
        std::fputs(moat::cli::version_text().c_str(), stdout);
        return 0;
    }
    if (command == "--help" || command == "-h" || command == "help") {
        // `moat help CMD` is `moat CMD --help`.
        if (argc > 2) {
            if (auto part = moat::cli::command_usage(argv[2])) {
                std::fputs(part->c_str(), stdout);
                return 0;
            }
            std::fprintf(stderr, "moat help: unknown command '%s' (see moat --help)\n", argv[2]);
            return moat::cli::exit_usage;
        }
        std::fputs(moat::cli::full_usage().c_str(), stdout);
        return 0;
    }
    if (moat::cli::asks_for_help(argc - 2, argv + 2)) {
        if (auto part = moat::cli::command_usage(command)) {
            std::fputs(part->c_str(), stdout);
            return 0;
        }
    }
    // Outside the try: the handlers below read argv[1] after an exception unwound the block.
    std::vector<char*> args(argv, argv + argc);
    try {
        if (takes_backend(command, argc, argv)) {
            select_backend_from(args);
            argc = static_cast<int>(args.size());
            args.push_back(nullptr);
            argv = args.data();
        }
        using handler = int (*)(int, char**);
        static constexpr std::pair<std::string_view, handler> commands[] = {
            {"run", moat::cli::run_command},
            {"create", moat::cli::create_command},
            {"exec", moat::cli::exec_command},
            {"port-forward", moat::cli::port_forward_command},
            {"session", moat::cli::session_command},
            {"cp", moat::cli::cp_command},
            {"destroy", moat::cli::destroy_command},
            {"network", moat::cli::network_command},
            {"ls", moat::cli::ls_command},
            {"pause", moat::cli::pause_command},
            {"resume", moat::cli::resume_command},
            {"doctor", moat::cli::doctor_command},
            {"inventory", moat::cli::inventory_command},
            {"janitor", moat::cli::janitor_command},
            {"smoke", moat::cli::smoke_command},
            {"bench", moat::cli::bench_command},
            {"mcp", moat::cli::mcp_command},
            {"demo", moat::cli::demo_command},
            {"serve", moat::cli::serve_command},
            {"template", moat::cli::template_command},
        };
        for (const auto& [name, run] : commands) {
            if (command == name) return run(argc - 2, argv + 2);
        }
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
