// moat pause ID... and moat resume ID...: freeze a sandbox in place (its processes, memory and
// files kept, its TTL standing still, its paused lifetime counting) and thaw it, whichever process
// created it (the sandbox is attached first). Exits 0 only if every one was.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <unistd.h>
#include <vector>

namespace moat::cli {
namespace {

asio::awaitable<int> pause_all(backend& b, std::vector<std::string> ids, bool pause) {
    const char* what = pause ? "pause" : "resume";
    int code = 0;
    for (const auto& id : ids) {
        auto attached = co_await b.async_attach(id);
        result<sandbox_info> done = make_error(errc::cancelled, "not tried");
        if (attached && pause) done = co_await b.async_pause(id);
        if (attached && !pause) done = co_await b.async_resume(id);
        if (!attached) done = std::move(attached).error();
        if (!done) {
            const int failed = report_error(what, done.error());
            if (code == 0 || failed == exit_failure) code = failed;
            continue;
        }
        const std::string line = std::string(to_string(done->state)) + " " + id + "\n";
        write_all(STDOUT_FILENO, line);
    }
    co_return code;
}

int pause_or_resume(int argc, char** argv, bool pause) {
    std::vector<std::string> ids;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with("-")) throw usage_error("unknown option '" + std::string(arg) + "'");
        ids.emplace_back(arg);
    }
    if (ids.empty()) {
        throw usage_error(pause ? "missing sandbox id (moat pause ID...)"
                                : "missing sandbox id (moat resume ID...)");
    }
    return run_with_backend(
        [&ids, pause](backend& b) { return pause_all(b, std::move(ids), pause); });
}

}  // namespace

int pause_command(int argc, char** argv) {
    return pause_or_resume(argc, argv, true);
}

int resume_command(int argc, char** argv) {
    return pause_or_resume(argc, argv, false);
}

}  // namespace moat::cli
