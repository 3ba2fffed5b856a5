// moat: the command-line interface to the moat sandbox runtime.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

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

constexpr const char* usage_text =
    "usage: moat <command> [options]\n"
    "\n"
    "commands:\n"
    "  run [--timeout S] [--stdin] [--memory MB] [--pids N] [--env K=V]... [--workdir DIR] "
    "[--json] -- "
    "CMD...\n"
    "      run CMD in a fresh sandbox, stream its output, destroy the sandbox, exit with CMD's "
    "code\n"
    "  create [--ttl S] [--label K=V]... [--memory MB] [--env K=V]... [--workdir DIR] [--json]\n"
    "      create a sandbox that outlives this command (until its TTL, default 1 h, or destroy);\n"
    "      prints its id on the last line\n"
    "  exec [--timeout S] [--stdin] [--env K=V]... [--workdir DIR] [--json] ID -- CMD...\n"
    "      run CMD in sandbox ID, stream its output, exit with CMD's code\n"
    "  session exec [--store URL] [--timeout S] [--stdin] [--json] KEY -- CMD...\n"
    "      run CMD in the sandbox of conversation KEY (attach-or-create: every moat process\n"
    "      naming KEY shares one sandbox, labelled moat.session=KEY); --store or MOAT_STORE:\n"
    "      host (the default, this host's processes), host:DIR, or a Redis URL (redis://,\n"
    "      rediss://, unix://; the password from MOAT_STORE_PASSWORD, not argv)\n"
    "  session end [--store URL] KEY\n"
    "      end conversation KEY's sandbox, confirmed (exit 4: no such session)\n"
    "  network flags of run, create, session exec and mcp (docs/network.md): --allow-host\n"
    "      PATTERN, --resolve NAME=ADDR, --allow-address CIDR (each repeatable), --network "
    "all|none\n"
    "  session ls [--json]\n"
    "      the sessions' sandboxes on this host, by key\n"
    "  cp [--raw] SRC DST\n"
    "      copy one file in or out; one side is ID:/absolute/path, the other a host path or -\n"
    "      (run, exec and cp to - show a sandbox's control characters on a terminal as ^[;\n"
    "      --raw passes them unchanged)\n"
    "  destroy ID...\n"
    "      end sandboxes and confirm they are gone\n"
    "  ls [--label K=V]... [--json]\n"
    "      list every sandbox on this host\n"
    "  inventory [--label K=V]... [--json]\n"
    "      every sandbox with its state, age, expiry, owner, labels and memory and pids usage\n"
    "  janitor [--dry-run]\n"
    "      clean up what crashes left behind (stale records, expired sandboxes, orphaned cgroups)\n"
    "  smoke\n"
    "      check this deployment: create, sh, python3, a byte-exact file, a wall limit, destroy\n"
    "  bench create [--n N] [--concurrency C] [--mode sequential|staggered|burst] [--json FILE]\n"
    "               [--plot FILE.svg]\n"
    "      create / first exec / destroy latency beside the raw isolation, bwrap and posix_spawn\n"
    "  bench advise [--from FILE | --create-p99-ms MS] --first-token-ms MS --arrivals-per-s R\n"
    "               [--create-rate R]\n"
    "      whether to pool, and how many, with the reasoning\n"
    "  bench sweep [--n N] | memory [--count N] | pool [--n N] | hostsize [--n N]\n"
    "      throughput and tail at 1-64 in flight; memory per idle sandbox with N held; warm\n"
    "      hand-out latency; create latency in a 2 GiB, 8-thread process\n"
    "  bench http [--n N] [--concurrency C] [--stream-mib M] [--json FILE]\n"
    "      moat's HTTP client and server on loopback: req/s, p50/p99, MB/s beside Node and curl\n"
    "  bench serve [--n N] [--json FILE]\n"
    "      create, a first command and kill through moat serve's HTTP API beside the library\n"
    "  bench e2b [--n N] [--concurrency C] [--lifecycle-n M] [--command CMD] [--json FILE]\n"
    "            [--sdk-dir DIR] [--sdk-script FILE] [--node PATH]\n"
    "      the C++ e2b backend vs the e2b JS SDK (client CPU per command, throughput) and\n"
    "      create + first exec through e2b vs local, against one moat serve\n"
    "  bench store [--store URL] [--password-file F] [--n N] [--claims N] [--json FILE]\n"
    "      the session store's part of an acquire, memory vs Redis; first-use claims/s, 8 workers\n"
    "  bench egress [--n N] [--mb M] [--json FILE]\n"
    "      downloads through a sandbox's egress proxy vs the host directly: ratio, setup p50\n"
    "  demo\n"
    "      a scripted model conversation through the tool layer: what a model would see\n"
    "  mcp [--timeout S] [--memory MB] [--env K=V]... [--label K=V]... [--tool-prefix P]\n"
    "      [--retry-ceiling N|off] [--session KEY [--store URL]]\n"
    "      a Model Context Protocol tool server on stdio (run_python, run_shell, write_file,\n"
    "      read_file, list_files, start/list/stop_process, read_process_output); one sandbox\n"
    "      per connection, destroyed when the client leaves; with --session, conversation\n"
    "      KEY's shared sandbox (as moat session), which outlives the connection\n"
    "  serve [--listen HOST:PORT] [--envd-listen HOST:PORT] [--api-key-file F]\n"
    "        [--tls-cert F --tls-key F] [--max-sandboxes N] [--destroy-on-exit] [--state-dir DIR]\n"
    "        [--max-file-bytes N] [--domain NAME]\n"
    "      an E2B-compatible sandbox host for the E2B SDKs: control plane (default\n"
    "      127.0.0.1:3000) and envd (127.0.0.1:49983), port 0 picks one; the API key from\n"
    "      --api-key-file or MOAT_API_KEY; prints one 'api URL' and one 'envd URL' line\n"
    "  doctor\n"
    "      show which isolation layers and limits this host can enforce, and run a live check\n"
    "      (with --backend e2b: the endpoint and the API key, then the live check)\n"
    "\n"
    "backends: run, create, exec, cp, destroy, ls, inventory, janitor, smoke, doctor, bench "
    "create\n"
    "and mcp take --backend local|e2b (default: $MOAT_BACKEND, else local). e2b drives an E2B\n"
    "fleet (E2B's cloud, a self-hosted cluster, or moat serve) configured by E2B_API_KEY,\n"
    "E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL and MOAT_E2B_CA_FILE (see docs/remote.md)\n"
    "\n"
    "exit codes: a command's own code for run and exec (124: its --timeout killed it, 130:\n"
    "interrupted); 2 bad usage or path, 3 moat failed, 4 no such sandbox or it has ended\n";

// The commands that run on a selectable backend (bench only for `bench create`).
bool takes_backend(std::string_view command, int argc, char** argv) {
    static constexpr std::string_view names[] = {"run",     "create", "exec",      "cp",
                                                 "destroy", "ls",     "inventory", "janitor",
                                                 "smoke",   "doctor", "mcp",       "session"};
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
        std::fputs(usage_text, stderr);
        return moat::cli::exit_usage;
    }
    const std::string_view command = argv[1];
    if (command == "--help" || command == "-h" || command == "help") {
        std::fputs(usage_text, stdout);
        return 0;
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
            {"session", moat::cli::session_command},
            {"cp", moat::cli::cp_command},
            {"destroy", moat::cli::destroy_command},
            {"ls", moat::cli::ls_command},
            {"doctor", moat::cli::doctor_command},
            {"inventory", moat::cli::inventory_command},
            {"janitor", moat::cli::janitor_command},
            {"smoke", moat::cli::smoke_command},
            {"bench", moat::cli::bench_command},
            {"mcp", moat::cli::mcp_command},
            {"demo", moat::cli::demo_command},
            {"serve", moat::cli::serve_command},
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
