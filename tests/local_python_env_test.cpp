// Every sandbox whose root has python3 gets a Python environment of its own
// (sandboxd/python_env.hpp): python, python3 and pip on PATH are one interpreter that sees the
// root's packages and what pip installs, as the sandbox's user, into a tmpfs of the sandbox's.
// Real sandboxes of the base root; the template side is in local_template_test.cpp, pip through
// the egress proxy in egress_sandbox_test.cpp.
#include "support/demo_wheel.hpp"
#include "support/local_fixture.hpp"

#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include <doctest/doctest.h>

#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// The host's interpreter the base root shows (python_env.cpp, host_python_interpreter), or "".
std::string host_python() {
    for (const char* candidate : {"/usr/local/bin/python3", "/usr/bin/python3"}) {
        std::error_code ec;
        const auto real = std::filesystem::canonical(candidate, ec);
        if (!ec && real.string().starts_with("/usr/") &&
            real.filename().string().starts_with("python3."))
            return real.string();
    }
    return {};
}

bool host_imports(const std::string& python, const std::string& module) {
    const std::string command = python + " -c 'import " + module + "' >/dev/null 2>&1";
    return std::system(command.c_str()) == 0;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "python, python3 and pip are the sandbox's own environment, which sees the "
                  "root's packages and belongs to the sandbox's user") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string python = host_python();
    if (python.empty()) {
        MESSAGE("SKIPPED: the host has no python3 below /usr");
        return;
    }
    const std::string version = python.substr(python.rfind('/') + 7);  // "3.11"
    const auto box = create();
    CHECK(sh(box.id, "echo $PATH").out.text() ==
          "/opt/moat/python/bin:/usr/local/bin:/usr/bin:/bin:/opt/moat/bin\n");
    for (const char* name : {"python", "python3", "pip", "pip3"}) {
        CAPTURE(name);
        CHECK(sh(box.id, std::string("command -v ") + name).out.text() ==
              std::string("/opt/moat/python/bin/") + name + "\n");
    }
    CHECK(sh(box.id, "readlink /opt/moat/python/bin/python3").out.text() == python + "\n");
    const auto prefix = sh(box.id, "python -c 'import sys; print(sys.prefix, sys.base_prefix)'");
    CHECK_MESSAGE(prefix.exit_code == 0, prefix.err.text());
    CHECK(prefix.out.text() == "/opt/moat/python /usr\n");
    CHECK(sh(box.id, "cat /opt/moat/python/pyvenv.cfg").out.text() ==
          "home = " + python.substr(0, python.rfind('/')) +
              "\ninclude-system-site-packages = true\nversion = " + version + "\n");
    // The sandbox's user owns all of it; the tmpfs is of the workspace's size.
    const auto owners = sh(box.id,
                           "stat -c '%U %G' /opt/moat/python /opt/moat/python/bin/pip "
                           "/opt/moat/python/lib/python" +
                               version + "/site-packages");
    CHECK(owners.out.text() == "user user\nuser user\nuser user\n");
    CHECK(sh(box.id, "stat -f -c %T /opt/moat/python").out.text() == "tmpfs\n");
    if (::access("/usr/lib/python3/dist-packages/pip", F_OK) == 0) {
        const auto pip = sh(box.id, "pip --version");
        CHECK_MESSAGE(pip.exit_code == 0, pip.err.text());
        CHECK(pip.out.text().find("(python " + version + ")") != std::string::npos);
    }
    // The root's packages stay visible (the seeds' pandas).
    if (host_imports(python, "pandas")) {
        const auto pandas = sh(box.id, "python3 -c 'import pandas; print(pandas.DataFrame)'");
        CHECK_MESSAGE(pandas.exit_code == 0, pandas.err.text());
    } else {
        MESSAGE("pandas is not installed on this host: its import is not checked");
    }
    // Another sandbox has an environment of its own.
    CHECK(sh(box.id, "touch /opt/moat/python/lib/python" + version + "/site-packages/mine.py")
              .exit_code == 0);
    const auto other = create();
    CHECK(sh(other.id, "python3 -c 'import mine'").exit_code != 0);
    CHECK(sh(box.id, "python3 -c 'import mine'").exit_code == 0);
    destroy(other.id);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "pip installs a wheel into the sandbox, importable at once with its console "
                  "script on PATH, and without network an index install fails fast saying why") {
    MOAT_REQUIRE_NAMESPACES();
    if (host_python().empty() || ::access("/usr/lib/python3/dist-packages/pip", F_OK) != 0) {
        MESSAGE("SKIPPED: the host has no python3 with Debian's pip");
        return;
    }
    const auto box = create();
    const std::string wheel = std::string("/workspace/") + moat::test::demo_wheel_name;
    REQUIRE(sh(box.id, moat::test::demo_wheel_command("python3", wheel)).exit_code == 0);
    const auto installed = sh(box.id, "pip install " + wheel, 120s);
    CHECK_MESSAGE(installed.exit_code == 0, installed.out.text() << installed.err.text());
    CHECK(installed.err.text().find("externally-managed-environment") == std::string::npos);
    CHECK(sh(box.id, "python -c 'import demo_pkg; print(demo_pkg.VALUE)'").out.text() == "42\n");
    CHECK(sh(box.id, "command -v demo-tool").out.text() == "/opt/moat/python/bin/demo-tool\n");
    CHECK(sh(box.id, "demo-tool").out.text() == "tool 42\n");
    CHECK(sh(box.id, "stat -c %U /opt/moat/python/bin/demo-tool").out.text() == "user\n");

    // No network: no index is reachable, and pip says so at once instead of retrying.
    const auto started = std::chrono::steady_clock::now();
    const auto refused = sh(box.id, "pip install demo-missing", 60s);
    const auto took = std::chrono::steady_clock::now() - started;
    CHECK(refused.exit_code != 0);
    CHECK(took < 20s);
    CHECK(refused.err.text().find("moat: this sandbox has no network access, so pip can install "
                                  "only from local files") != std::string::npos);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "with the network off the model is told pip cannot install, and pip says so") {
    MOAT_REQUIRE_NAMESPACES();
    if (host_python().empty() || ::access("/usr/lib/python3/dist-packages/pip", F_OK) != 0) {
        MESSAGE("SKIPPED: the host has no python3 with Debian's pip");
        return;
    }
    moat::runtime rt(*local);
    moat::session_manager manager(rt, moat::manager_options{});
    moat::tool_session tools(manager, "offline");
    for (const auto& d : tools.definitions()) {
        if (d.name == "run_python")
            CHECK(d.description.find("The network is off: no pip install") != std::string::npos);
        if (d.name == "run_shell")
            CHECK(d.description.find("The network is off: no package installs") !=
                  std::string::npos);
    }
    auto refused = run(tools.async_run_shell("pip install demo-missing", 60s));
    REQUIRE(refused);
    CHECK(refused->exit_code != 0);
    CHECK(refused->duration < 20s);
    CHECK(refused->stderr_text.find("moat: this sandbox has no network access") !=
          std::string::npos);
    auto missing = run(tools.async_run_python("import demo_missing"));
    REQUIRE(missing);
    CHECK(missing->hint.find("the network is off") != std::string::npos);
    (void)run(manager.async_shutdown());
}
