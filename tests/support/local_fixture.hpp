// A local backend on its own io_context, with synchronous wrappers for the common steps.
#pragma once

#include <moat/local_backend.hpp>
#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>

#include "support/async_test.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>

namespace moat::test {

// True if this kernel lets us make user, pid, mount and net namespaces. When it does not, tests
// that need them are skipped, unless MOAT_REQUIRE_NAMESPACES=1 (set by CI), which fails them.
bool namespaces_available();

#define MOAT_REQUIRE_NAMESPACES()                                                     \
    do {                                                                              \
        if (!::moat::test::namespaces_available()) {                                  \
            MESSAGE("SKIPPED: this kernel does not allow the namespaces moat needs"); \
            return;                                                                   \
        }                                                                             \
    } while (false)

// An exec request that runs `command` through /bin/sh -c.
inline exec_request shell(const std::string& command) {
    exec_request request;
    request.shell = command;
    return request;
}

// Runs `command` through the handle's ordered lane and stores its outcome in `out` (for a
// command a test starts beside what it checks).
inline asio::awaitable<void> exec_into(std::shared_ptr<sandbox> box, std::string command,
                                       std::shared_ptr<std::optional<result<exec_result>>> out) {
    auto request = shell(command);
    out->emplace(co_await box->async_exec(std::move(request)));
}

struct local_fixture {
    local_fixture();
    ~local_fixture();

    template <class T>
    T run(asio::awaitable<T> task, std::chrono::seconds watchdog = std::chrono::seconds(120)) {
        return run_async(io, std::move(task), watchdog);
    }

    // Creates a sandbox; the test fails if it cannot.
    sandbox_info create(sandbox_spec spec = {});
    // Runs `shell` through /bin/sh -c; the test fails if moat reports an error.
    exec_result sh(const std::string& id, const std::string& shell,
                   std::chrono::milliseconds wall_limit = std::chrono::seconds(60));
    void destroy(const std::string& id);
    // Stops the test's own tasks, then destroys the backend (as when its process exits): its
    // helper stops, sandboxes that do not survive their owner die with it, attached ones are
    // detached.
    void shut_down();

    asio::io_context io;
    std::unique_ptr<backend> local;
    // Owner of the coroutines a test starts beside the one it runs (an exec that will be
    // cancelled, a burst of creates): failures are logged, and shut_down() stops them first.
    task_group tasks{io.get_executor(), "test"};
};

}  // namespace moat::test
