// moat destroy ID...: ends each sandbox and confirms it is gone (pid 1 reaped, cgroups, attach
// socket and record removed), whichever process created it. Exits 0 only if every one was.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <unistd.h>
#include <vector>

namespace moat::cli {
namespace {

asio::awaitable<int> destroy_all(backend& b, std::vector<std::string> ids) {
    int code = 0;
    for (const auto& id : ids) {
        auto destroyed = co_await b.async_destroy(id);
        if (!destroyed) {
            const int failed = report_error("destroy", destroyed.error());
            if (code == 0 || failed == exit_failure) code = failed;
            continue;
        }
        const std::string line = "destroyed " + id + "\n";
        write_all(STDOUT_FILENO, line);
    }
    co_return code;
}

}  // namespace

int destroy_command(int argc, char** argv) {
    std::vector<std::string> ids;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with("-")) throw usage_error("unknown option '" + std::string(arg) + "'");
        ids.emplace_back(arg);
    }
    if (ids.empty()) throw usage_error("missing sandbox id (moat destroy ID...)");
    return run_with_backend([&ids](backend& b) { return destroy_all(b, std::move(ids)); });
}

}  // namespace moat::cli
