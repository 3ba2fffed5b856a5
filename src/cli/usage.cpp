// The CLI's usage text: the whole of it for `moat --help`, one command's part for `moat CMD
// --help`.
#include "cli/usage.hpp"

#include <moat/version.hpp>

#include "wire/protocol.hpp"

namespace moat::cli {
namespace {

struct usage_block {
    std::string_view command;  // the first word of the command line it documents
    std::string_view text;
};

// In the order `moat --help` prints them. "(network)" is the note on the network flags.
constexpr usage_block blocks[] = {
    {"run",
     "  run [-it] [--root] [--timeout S] [--stdin] [--memory MB] [--pids N] [--env K=V]...\n"
     "      [--workdir DIR] [--template NAME] [--allow-sudo] [--json] -- CMD...\n"
     "      run CMD in a fresh sandbox, stream its output, destroy the sandbox, exit with CMD's "
     "code\n"
     "      (-t: on a terminal of the sandbox's own; -it: this terminal is its terminal, raw,\n"
     "      Ctrl-C goes to CMD; -i alone: stdin read whole first, as --stdin; --root: as the\n"
     "      sandbox's root; --allow-sudo: sudo inside runs as that root)\n"},
    {"create",
     "  create [--ttl S] [--label K=V]... [--memory MB] [--env K=V]... [--workdir DIR]\n"
     "         [--template NAME] [--allow-sudo] [--json]\n"
     "      create a sandbox that outlives this command (until its TTL, default 1 h, or destroy);\n"
     "      prints its id on the last line\n"},
    {"exec",
     "  exec [-it] [--root] [--timeout S] [--stdin] [--env K=V]... [--workdir DIR] [--json] ID "
     "-- CMD...\n"
     "      run CMD in sandbox ID, stream its output, exit with CMD's code (-t, -it, -i, --root: "
     "as run)\n"},
    {"port-forward",
     "  port-forward ID [LOCAL_ADDR:]LOCAL_PORT:PORT...\n"
     "      relay connections to local ports (on 127.0.0.1 unless LOCAL_ADDR; LOCAL_PORT 0 or\n"
     "      empty: any free port) to PORT inside sandbox ID; prints one 'forwarding ADDR -> "
     "ID:PORT'\n"
     "      line per mapping; runs until Ctrl-C or SIGTERM (exit 0) or until the sandbox ends "
     "(exit 1)\n"},
    {"session",
     "  session exec [--store URL] [--timeout S] [--stdin] [--json] [--template NAME]\n"
     "               KEY -- CMD...\n"
     "      run CMD in the sandbox of conversation KEY (attach-or-create: every moat process\n"
     "      naming KEY shares one sandbox, labelled moat.session=KEY); --store or MOAT_STORE:\n"
     "      host (the default, this host's processes), host:DIR, or a Redis URL (redis://,\n"
     "      rediss://, unix://; the password from MOAT_STORE_PASSWORD, not argv)\n"},
    {"session",
     "  session end [--store URL] KEY\n"
     "      end conversation KEY's sandbox, confirmed (exit 4: no such session)\n"},
    {"(network)",
     "  network flags of run, create, session exec and mcp (docs/network.md): --allow-host\n"
     "      PATTERN, --resolve NAME=ADDR, --allow-address CIDR (each repeatable), --network "
     "all|none\n"},
    {"session",
     "  session ls [--json]\n"
     "      the sessions' sandboxes on this host, by key\n"},
    {"cp",
     "  cp [--raw] SRC DST\n"
     "      copy one file in or out; one side is ID:/absolute/path, the other a host path or -\n"
     "      (run, exec and cp to - show a sandbox's control characters on a terminal as ^[;\n"
     "      --raw passes them unchanged)\n"},
    {"template",
     "  template build NAME --from-dir DIR|--from-oci PATH[:TAG] | ls [--json] | rm NAME |\n"
     "           verify NAME\n"
     "      the local backend's templates (a writable root per sandbox over a read-only layer);\n"
     "      --from-oci takes an OCI image layout (a docker save archive: skopeo copy\n"
     "      docker-archive:FILE oci:DIR:TAG first);\n"
     "      kept in --data-dir, MOAT_DATA_DIR or /var/lib/moat, within --max-data-mb N or\n"
     "      MOAT_MAX_DATA_MB (unused layers go first); --template NAME on run and\n"
     "      create picks one (default: base, the host's /usr read-only)\n"},
    {"network",
     "  network ID [--allow-host PATTERN]... [--resolve NAME=ADDR]... [--allow-address CIDR]...\n"
     "          [--network all|none]\n"
     "      replace the egress rules of running sandbox ID (the network flags, as create's; no\n"
     "      flag: none); it may narrow, and widen only within the sandbox's limit (what it was\n"
     "      created with, or moat serve's operator network); a connection to a host no longer\n"
     "      allowed is closed. A sandbox created with network none cannot get one\n"},
    {"destroy",
     "  destroy ID...\n"
     "      end sandboxes and confirm they are gone\n"},
    {"pause",
     "  pause ID...\n"
     "      freeze sandboxes in place: processes, memory and files kept, no CPU used, the TTL\n"
     "      standing still and the paused lifetime (24 h) counting; exec and the rest resume\n"
     "      them (a host reboot loses a paused sandbox like a running one)\n"},
    {"resume",
     "  resume ID...\n"
     "      thaw paused sandboxes, everything as it was\n"},
    {"ls",
     "  ls [--label K=V]... [--json]\n"
     "      list every sandbox on this host\n"},
    {"inventory",
     "  inventory [--label K=V]... [--json]\n"
     "      every sandbox with its state, age, expiry, owner, labels, memory and pids usage, and\n"
     "      its egress: bytes moved and host memory its connections hold\n"},
    {"janitor",
     "  janitor [--dry-run]\n"
     "      clean up what crashes left behind (stale records, expired sandboxes, orphaned "
     "cgroups)\n"},
    {"smoke",
     "  smoke\n"
     "      check this deployment: create, sh, python3, a byte-exact file, a wall limit, "
     "destroy\n"},
    {"bench",
     "  bench create [--n N] [--concurrency C] [--mode sequential|staggered|burst] [--json FILE]\n"
     "               [--plot FILE.svg] [--template NAME]\n"
     "      create / first exec / destroy latency beside the raw isolation, bwrap and "
     "posix_spawn\n"
     "      (--template: a sandbox of that template too, each round, and its ratio)\n"},
    {"bench",
     "  bench advise [--from FILE | --create-p99-ms MS] --first-token-ms MS --arrivals-per-s R\n"
     "               [--create-rate R]\n"
     "      whether to pool, and how many, with the reasoning\n"},
    {"bench",
     "  bench sweep [--n N] | memory [--count N] | pool [--n N] | hostsize [--n N]\n"
     "      throughput and tail at 1-64 in flight; memory per idle sandbox with N held; warm\n"
     "      hand-out latency; create latency in a 2 GiB, 8-thread process\n"},
    {"bench",
     "  bench http [--n N] [--concurrency C] [--stream-mib M] [--json FILE]\n"
     "      moat's HTTP client and server on loopback: req/s, p50/p99, MB/s beside Node and "
     "curl\n"},
    {"bench",
     "  bench serve [--n N] [--json FILE]\n"
     "      create, a first command and kill through moat serve's HTTP API beside the library\n"},
    {"bench",
     "  bench e2b [--n N] [--concurrency C] [--lifecycle-n M] [--command CMD] [--json FILE]\n"
     "            [--sdk-dir DIR] [--sdk-script FILE] [--node PATH]\n"
     "      the C++ e2b backend vs the e2b JS SDK (client CPU per command, throughput) and\n"
     "      create + first exec through e2b vs local, against one moat serve\n"},
    {"bench",
     "  bench store [--store URL] [--password-file F] [--n N] [--claims N] [--json FILE]\n"
     "      the session store's part of an acquire, memory vs Redis; first-use claims/s, 8 "
     "workers\n"},
    {"bench",
     "  bench egress [--n N] [--mb M] [--json FILE]\n"
     "      downloads through a sandbox's egress proxy vs the host directly: ratio, setup p50\n"},
    {"bench",
     "  bench ports [--n N] [--mb M] [--setup-n S] [--json FILE]\n"
     "      downloads from a server in a sandbox through a forwarded port vs the same server on\n"
     "      the host: throughput ratio, connection setup p50/p99\n"},
    {"bench",
     "  bench python [--n N] [--json FILE]\n"
     "      run_python(\"1+1\") round trips, a private session vs one two workers share, beside\n"
     "      `true` commands: p50/p99 and the difference\n"},
    {"bench",
     "  bench pty [--n N] [--json FILE]\n"
     "      one-byte echo round trips through a sandbox's terminal beside a spawned cat's pipes:\n"
     "      p50/p99 and the ratio\n"},
    {"bench",
     "  bench pause [--n N] [--json FILE]\n"
     "      pause and resume of a sandbox running a busy loop and a Python process: p50/p99\n"},
    {"demo",
     "  demo\n"
     "      a scripted model conversation through the tool layer: what a model would see\n"},
    {"mcp",
     "  mcp [--timeout S] [--memory MB] [--env K=V]... [--label K=V]... [--template NAME]\n"
     "      [--tool-prefix P] [--retry-ceiling N|off] [--session KEY [--store URL]] [--images]\n"
     "      a Model Context Protocol tool server on stdio (run_python, run_shell, write_file,\n"
     "      read_file, list_files, start/list/stop_process, read_process_output); one sandbox\n"
     "      per connection, destroyed when the client leaves; with --session, conversation\n"
     "      KEY's shared sandbox (as moat session), which outlives the connection; with\n"
     "      --images, a cell's figures also reach the client as image content (up to 4, 1 MiB)\n"},
    {"serve",
     "  serve [--listen HOST:PORT] [--envd-listen HOST:PORT] [--api-key-file F]\n"
     "        [--tls-cert F --tls-key F] [--max-sandboxes N] [--destroy-on-exit] [--state-dir "
     "DIR]\n"
     "        [--max-file-bytes N] [--domain NAME] [--private-ports] [--paused-memory-mb N]\n"
     "      an E2B-compatible sandbox host for the E2B SDKs: control plane (default\n"
     "      127.0.0.1:3000) and envd (127.0.0.1:49983), port 0 picks one; the API key from\n"
     "      --api-key-file or MOAT_API_KEY; prints one 'api URL' and one 'envd URL' line.\n"
     "      A sandbox's ports are served on envd's listener as <port>-<id>.NAME (getHost);\n"
     "      public unless the create says allowPublicTraffic: false, or --private-ports.\n"
     "      Paused sandboxes count against --max-sandboxes; past --paused-memory-mb, the one\n"
     "      paused longest ago is ended\n"},
    {"doctor",
     "  doctor\n"
     "      show which isolation layers and limits this host can enforce, and run a live check\n"
     "      (with --backend e2b: the endpoint and the API key, then the live check)\n"},
};

constexpr std::string_view closing_notes =
    "backends: run, create, exec, cp, destroy, pause, resume, ls, inventory, janitor, smoke,\n"
    "doctor, bench create and mcp take --backend local|e2b (default: $MOAT_BACKEND, else\n"
    "local). e2b drives an E2B fleet (E2B's cloud, a self-hosted cluster, or moat serve)\n"
    "configured by E2B_API_KEY, E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL and\n"
    "MOAT_E2B_CA_FILE (see docs/remote.md)\n"
    "\n"
    "exit codes: a command's own code for run and exec (124: its --timeout killed it, 130:\n"
    "interrupted); 2 bad usage or path, 3 moat failed, 4 no such sandbox or it has ended\n";

// The commands whose help adds the network flags' note.
bool takes_network_flags(std::string_view command) {
    return command == "run" || command == "create" || command == "session" || command == "mcp";
}

}  // namespace

std::string full_usage() {
    std::string out =
        "usage: moat <command> [options]    (moat <command> --help: that command's "
        "part)\n\ncommands:\n";
    for (const auto& block : blocks) out += block.text;
    out += "  --version\n      moat's version and its helper's wire protocol version\n\n";
    out += closing_notes;
    return out;
}

std::optional<std::string> command_usage(std::string_view command) {
    std::string out;
    for (const auto& block : blocks) {
        if (block.command == command) out += block.text;
    }
    if (out.empty()) return std::nullopt;
    if (takes_network_flags(command)) {
        for (const auto& block : blocks) {
            if (block.command == "(network)") out += block.text;
        }
    }
    return "usage:\n" + out + "\n" + std::string(closing_notes);
}

bool asks_for_help(int argc, char** argv) {
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--") return false;  // what follows is the sandbox's command
        if (arg == "--help" || arg == "-h") return true;
    }
    return false;
}

std::string version_text() {
    return "moat " + std::string(version) + " (helper wire protocol " +
           std::to_string(wire::protocol_version) + ")\n";
}

}  // namespace moat::cli
