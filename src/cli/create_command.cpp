// moat create: a sandbox that outlives the CLI (survive_owner) until its TTL or `moat destroy`.
// Prints its id on the last line of stdout (or one JSON object with --json).
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/sandbox_report.hpp"

#include <unistd.h>
#include <cstdio>

namespace moat::cli {
namespace {

struct create_options {
    sandbox_spec spec;
    bool json = false;
};

create_options parse_create_options(int argc, char** argv) {
    create_options o;
    o.spec.survive_owner = true;
    network_flags network;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--json") {
            o.json = true;
        } else if (auto seconds = flag_value("--ttl", argc, argv, i)) {
            const auto ttl = parse_seconds(*seconds);
            if (!ttl || *ttl > sandbox_spec::max_ttl) {
                throw usage_error(
                    "--ttl: expected seconds between 0.001 and 2592000 (30 days), got '" +
                    *seconds + "'");
            }
            o.spec.ttl = *ttl;
        } else if (auto label = flag_value("--label", argc, argv, i)) {
            auto [key, value] = parse_key_value("--label", *label);
            o.spec.labels[key] = value;
        } else if (spec_flag(argc, argv, i, o.spec) || network_flag(argc, argv, i, network)) {
            continue;
        } else {
            throw usage_error("unexpected argument '" + std::string(arg) + "'");
        }
    }
    o.spec.network = finish_network(network);
    if (!o.spec.labels.contains("moat.cli")) o.spec.labels["moat.cli"] = "create";
    return o;
}

asio::awaitable<int> create_sandbox(backend& b, create_options o) {
    auto created = co_await b.async_create(o.spec);
    if (!created) co_return report_error("create", created.error());
    std::string text;
    if (o.json) {
        json_writer w;
        write_sandbox_json(w, *created);
        text = w.take() + "\n";
    } else {
        text = created->id + "\n";
    }
    write_all(STDOUT_FILENO, text);
    co_return 0;
}

}  // namespace

int create_command(int argc, char** argv) {
    create_options options = parse_create_options(argc, argv);
    return run_with_backend(
        [&options](backend& b) { return create_sandbox(b, std::move(options)); });
}

}  // namespace moat::cli
