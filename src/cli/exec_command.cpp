// moat exec: runs a command in an existing sandbox (attached by id), streams its output and exits
// with its code; 124 when --timeout killed it, 130 on Ctrl-C (the command is killed).
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/terminal_session.hpp"

namespace moat::cli {
namespace {

struct exec_options {
    std::string id;
    command_flags command;
};

exec_options parse_exec_options(int argc, char** argv) {
    exec_options o;
    int i = 0;
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (command_flag(argc, argv, i, o.command)) {
            continue;
        } else if (auto dir = flag_value("--workdir", argc, argv, i)) {
            o.command.request.cwd = parse_absolute_path("--workdir", *dir);
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else {
            break;
        }
    }
    if (i == argc) throw usage_error("missing sandbox id (moat exec [options] ID -- CMD...)");
    o.id = argv[i++];
    if (i < argc && std::string_view(argv[i]) == "--") ++i;
    for (; i < argc; ++i) o.command.request.argv.emplace_back(argv[i]);
    if (o.command.request.argv.empty())
        throw usage_error("missing command (moat exec [options] ID -- CMD...)");
    return o;
}

asio::awaitable<int> exec_in_sandbox(backend& b, exec_options o) {
    runtime sandboxes(b);
    auto attached = co_await sandboxes.async_attach(o.id);
    if (!attached) co_return report_error("exec", attached.error());
    auto box = std::move(*attached);
    const command_flags& c = o.command;
    auto outcome = co_await run_in_box(box, c);
    co_return finish_command("exec", o.id, outcome, c);
}

}  // namespace

int exec_command(int argc, char** argv) {
    exec_options options = parse_exec_options(argc, argv);
    return run_command_with_backend("exec", options.command, [&options](backend& b) {
        return exec_in_sandbox(b, std::move(options));
    });
}

}  // namespace moat::cli
