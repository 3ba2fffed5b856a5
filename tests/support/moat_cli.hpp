// Running the `moat` command from a test, as a user would: through the shell, stdout and stderr
// together. moat::test::moat_cli_path() is the built binary (tests/CMakeLists.txt).
#pragma once

#include "support/build_paths.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <string>

namespace moat::test {

struct cli_outcome {
    int exit_code = -1;
    std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh: its stdout (what the command line does not redirect) and its
// exit code.
inline cli_outcome shell_command(const std::string& command) {
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

// Runs `prefix moat args` (prefix: e.g. "setpriv --reuid=65534 ..." or "").
inline cli_outcome moat_cli(const std::string& prefix, const std::string& args) {
    std::string command = std::string(moat::test::moat_cli_path()) + " " + args + " 2>&1";
    if (!prefix.empty()) command = prefix + " " + command;
    return shell_command(command);
}

inline cli_outcome moat_cli(const std::string& args) {
    return moat_cli("", args);
}

}  // namespace moat::test
