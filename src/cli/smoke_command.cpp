// moat smoke: a deployment check through the same path the library's users take (runtime and
// handle): create a sandbox, run sh and python3, round-trip all 256 byte values, run a command
// past its wall limit, destroy and confirm. Prints a line per step; exits 0, or exit_failure with
// one line naming what failed.
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <chrono>
#include <cstdio>

namespace moat::cli {
namespace {

int failed(const char* step, const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "moat smoke: %s failed: %s\n", step, why.c_str());
    return exit_failure;
}

void passed(const char* step) {
    std::printf("ok  %s\n", step);
}

asio::awaitable<int> smoke(backend& b) {
    runtime sandboxes(b);
    sandbox_spec spec;
    spec.labels["moat.cli"] = "smoke";
    spec.ttl = std::chrono::minutes(5);
    auto created = co_await sandboxes.async_create(spec);
    if (!created) co_return failed("create", created.error().to_string());
    auto box = std::move(*created);
    passed("create");

    exec_request sh;
    sh.argv = {"/bin/sh", "-c", "echo shell works"};
    auto shell = co_await box->async_exec(sh);
    if (!shell || shell->exit_code != 0 || shell->out.text() != "shell works\n") {
        co_return failed("sh", shell ? "unexpected output '" + shell->out.text() + "'"
                                     : shell.error().to_string());
    }
    passed("sh runs");

    exec_request py;
    py.argv = {"python3", "-c", "print(6 * 7)"};
    auto python = co_await box->async_exec(py);
    if (!python || python->exit_code != 0 || python->out.text() != "42\n") {
        co_return failed("python3", python ? "exit " + std::to_string(python->exit_code) + ": " +
                                                 python->err.text()
                                           : python.error().to_string());
    }
    passed("python3 runs");

    std::string bytes;
    for (int value = 0; value < 256; ++value) bytes.push_back(static_cast<char>(value));
    std::vector<file_write> files(1);
    files[0].path = "/workspace/bytes.bin";
    files[0].content = bytes;
    auto written = co_await box->async_write_files(files);
    std::vector<std::string> paths{"/workspace/bytes.bin"};
    auto read = co_await box->async_read_files(paths);
    if (!written || !written->front().outcome || !read || !read->front().content ||
        *read->front().content != bytes) {
        co_return failed("file round trip", "the 256 byte values did not come back unchanged");
    }
    passed("all 256 byte values round-trip through a file");

    exec_request runaway;
    runaway.argv = {"sleep", "30"};
    runaway.wall_limit = std::chrono::milliseconds(500);
    auto stopped = co_await box->async_exec(runaway);
    if (!stopped || !stopped->timed_out || stopped->exit_code != 124) {
        co_return failed("wall limit", stopped ? "the command was not killed at its wall limit"
                                               : stopped.error().to_string());
    }
    passed("a command past its wall limit is killed (exit 124)");

    const std::string id = box->id();
    auto destroyed = co_await box->async_destroy();
    if (!destroyed) co_return failed("destroy", destroyed.error().to_string());
    auto gone = co_await b.async_inspect(id);
    if (gone) co_return failed("destroy", "the sandbox is still listed after its destroy");
    passed("destroy confirmed");
    std::printf("moat smoke: all checks passed\n");
    co_return 0;
}

}  // namespace

int smoke_command(int argc, char** argv) {
    if (argc != 0) throw usage_error("unexpected argument '" + std::string(argv[0]) + "'");
    return run_with_backend([](backend& b) { return smoke(b); });
}

}  // namespace moat::cli
