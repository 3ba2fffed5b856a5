// moat run: one command in a fresh sandbox, output streamed live, sandbox destroyed after.
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <asio/this_coro.hpp>

#include <cstdio>

namespace moat::cli {
namespace {

struct run_options {
    sandbox_spec spec;
    exec_request request;
    bool json = false;
    bool raw = false;         // stream control characters to a terminal unchanged
    bool read_stdin = false;  // feed this process's stdin (up to 10 MiB) to the command
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
        if (arg == "--json") {
            o.json = true;
        } else if (arg == "--raw") {
            o.raw = true;
        } else if (arg == "--stdin") {
            o.read_stdin = true;
        } else if (auto seconds = flag_value("--timeout", argc, argv, i)) {
            o.request.wall_limit = parse_wall_limit("--timeout", *seconds);
        } else if (auto megabytes = flag_value("--memory", argc, argv, i)) {
            o.spec.limits.memory_bytes = parse_megabytes("--memory", *megabytes);
        } else if (auto count = flag_value("--pids", argc, argv, i)) {
            auto n = parse_unsigned(*count);
            if (!n || *n < 1 || *n > 1'000'000) {
                throw usage_error("--pids: expected a count between 1 and 1000000, got '" + *count +
                                  "'");
            }
            o.spec.limits.pids = static_cast<std::uint32_t>(*n);
        } else if (auto pair = flag_value("--env", argc, argv, i)) {
            auto [key, value] = parse_key_value("--env", *pair);
            o.spec.env[key] = value;
        } else if (auto dir = flag_value("--workdir", argc, argv, i)) {
            o.spec.layout.workdir = parse_absolute_path("--workdir", *dir);
        } else if (network_flag(argc, argv, i, network)) {
            continue;
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else {
            break;  // the command starts here ("--" is optional)
        }
    }
    for (; i < argc; ++i) o.request.argv.emplace_back(argv[i]);
    if (o.request.argv.empty()) throw usage_error("missing command (moat run [options] -- CMD...)");
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
        co_return exit_failure;
    }
    auto box = std::move(*created);
    auto outcome = co_await exec_for_terminal(box, o.request, o.json, o.raw);
    // Destroy whatever happened, cancellation included, and confirm it.
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await box->async_destroy();

    if (o.json) print_exec_json(box->id(), outcome);
    int code = exec_exit_code("run", outcome, o.json, o.request.wall_limit);
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
    if (options.read_stdin) {
        if (auto failed = read_stdin_into("run", options.request)) return *failed;
    }
    return run_with_backend(
        [&options](backend& b) { return run_in_sandbox(b, std::move(options)); });
}

}  // namespace moat::cli
