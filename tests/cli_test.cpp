// The moat CLI as a user runs it: exit codes, streaming, bad input.
#include <doctest/doctest.h>

#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <string>

namespace {

struct cli_outcome {
    int exit_code = -1;
    std::string output;  // stdout and stderr together
};

cli_outcome moat_cli(const std::string& args) {
    const std::string command = std::string(MOAT_CLI_PATH) + " " + args + " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    cli_outcome o;
    std::array<char, 4096> buffer{};
    std::size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        o.output.append(buffer.data(), n);
    const int status = ::pclose(pipe);
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return o;
}

}  // namespace

TEST_CASE("moat run streams the command's output and exits with its code") {
    MOAT_REQUIRE_NAMESPACES();
    auto o = moat_cli("run -- python3 -c \"print('hello from the sandbox'); raise SystemExit(7)\"");
    CHECK(o.exit_code == 7);
    CHECK(o.output == "hello from the sandbox\n");
    o = moat_cli("run --env GREETING=hi --workdir /tmp -- sh -c 'echo $GREETING; pwd'");
    CHECK(o.exit_code == 0);
    CHECK(o.output == "hi\n/tmp\n");
}

TEST_CASE("moat run exits 124 when the command passes its timeout") {
    MOAT_REQUIRE_NAMESPACES();
    const auto o = moat_cli("run --timeout 0.5 -- sleep 30");
    CHECK(o.exit_code == 124);
    CHECK(o.output.find("wall limit") != std::string::npos);
}

TEST_CASE("moat run --json prints one JSON object with the result") {
    MOAT_REQUIRE_NAMESPACES();
    const auto o = moat_cli("run --json -- sh -c 'echo out; echo err >&2; exit 2'");
    CHECK(o.exit_code == 2);
    CHECK(o.output.find("\"exit_code\":2") != std::string::npos);
    CHECK(o.output.find("\"stdout\":\"out\\n\"") != std::string::npos);
    CHECK(o.output.find("\"stderr\":\"err\\n\"") != std::string::npos);
    CHECK(o.output.find("\"timed_out\":false") != std::string::npos);
}

TEST_CASE("moat run rejects bad input with one line and an exit code below 124") {
    for (const char* args :
         {"run --timeout -1 -- true", "run --timeout abc -- true", "run --bogus -- true", "run",
          "run --memory 1 -- true", "run --pids 0 -- true", "run --env NOEQUALS -- true",
          "run --workdir relative -- true", "frobnicate"}) {
        const auto o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 2, args);
        CHECK_MESSAGE(o.exit_code < 124, args);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      args << ": " << o.output);
        CHECK_MESSAGE(o.output.rfind("moat", 0) == 0, args);
    }
}
