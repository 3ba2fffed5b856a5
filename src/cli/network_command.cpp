// moat network ID [network flags]: replaces the egress rules of a running sandbox (created with
// survive_owner, as `moat create` makes them) without restarting it, through an attach: the same
// flags as create (--allow-host, --resolve, --allow-address, --network all|none), the whole new
// network (no flag: none). It may narrow, and widen only within the sandbox's limit
// (docs/network.md "Live updates"). Prints the network now in force.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <unistd.h>

namespace moat::cli {
namespace {

asio::awaitable<int> update(backend& b, std::string id, sandbox_network network) {
    auto attached = co_await b.async_attach(id);
    if (!attached) co_return report_error("network", attached.error());
    auto updated = co_await b.async_update_network(id, std::move(network));
    if (!updated) co_return report_error("network", updated.error());
    std::string line = id + ": network " + std::string(to_string(updated->network.mode));
    for (const auto& host : updated->network.allow_hosts) line += " " + host;
    line += "\n";
    write_all(STDOUT_FILENO, line);
    co_return 0;
}

}  // namespace

int network_command(int argc, char** argv) {
    std::string id;
    network_flags flags;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (network_flag(argc, argv, i, flags)) continue;
        if (arg.starts_with("-")) throw usage_error("unknown option '" + std::string(arg) + "'");
        if (!id.empty()) throw usage_error("one sandbox id only (moat network ID [flags])");
        id = arg;
    }
    if (id.empty()) throw usage_error("missing sandbox id (moat network ID [flags])");
    sandbox_network network = finish_network(flags);
    return run_with_backend(
        [&id, &network](backend& b) { return update(b, std::move(id), std::move(network)); });
}

}  // namespace moat::cli
