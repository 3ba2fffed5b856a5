// moat run: one command in a fresh sandbox, output streamed live, sandbox destroyed after.
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/terminal_session.hpp"

#include <asio/this_coro.hpp>

#include <cstdio>

namespace moat::cli {
namespace {

struct run_options {
    sandbox_spec spec;
    command_flags command;
};

run_options parse_run_options(int argc, char** argv) {
    run_options o;
    network_flags network;
    int i = 0;
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        // spec_flag first: run's --env is the sandbox's environment, not only the command's.
        if (spec_flag(argc, argv, i, o.spec) || command_flag(argc, argv, i, o.command)) {
            continue;
        } else if (auto count = flag_value("--pids", argc, argv, i)) {
            auto n = parse_unsigned(*count);
            if (!n || *n < 1 || *n > 1'000'000) {
                throw usage_error("--pids: expected a count between 1 and 1000000, got '" + *count +
                                  "'");
            }
            o.spec.limits.pids = static_cast<std::uint32_t>(*n);
        } else if (network_flag(argc, argv, i, network)) {
            continue;
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else {
            break;  // the command starts here ("--" is optional)
        }
    }
    for (; i < argc; ++i) o.command.request.argv.emplace_back(argv[i]);
    if (o.command.request.argv.empty())
        throw usage_error("missing command (moat run [options] -- CMD...)");
    o.spec.network = finish_network(network);
    o.spec.labels["moat.cli"] = "run";
    return o;
}

asio::awaitable<int> run_in_sandbox(backend& b, run_options o) {
    runtime sandboxes(b);
    auto created = co_await sandboxes.async_create(o.spec);
    if (!created) {
        if (created.error().code == errc::cancelled) co_return 128 + interrupting_signal();
        std::fprintf(stderr, "moat run: cannot create a sandbox: %s\n",
                     created.error().to_string().c_str());
        // A spec the backend refused (an unknown template, a limit past the host's) is bad usage.
        if (created.error().code == errc::invalid_argument) co_return exit_usage;
        co_return exit_failure;
    }
    auto box = std::move(*created);
    const command_flags& c = o.command;
    auto outcome = co_await run_in_box(box, c);
    // Destroy whatever happened, cancellation included, and confirm it.
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await box->async_destroy();

    int code = finish_command("run", box->id(), outcome, c);
    if (!destroyed) {
        std::fprintf(stderr, "moat run: destroy of %s failed: %s\n", box->id().c_str(),
                     destroyed.error().to_string().c_str());
        if (code == 0) code = exit_failure;
    }
    co_return code;
}

}  // namespace

int run_command(int argc, char** argv) {
    run_options options = parse_run_options(argc, argv);
    return run_command_with_backend("run", options.command, [&options](backend& b) {
        return run_in_sandbox(b, std::move(options));
    });
}

}  // namespace moat::cli
