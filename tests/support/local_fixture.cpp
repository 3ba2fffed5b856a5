#include "support/local_fixture.hpp"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <cstdlib>

namespace moat::test {
namespace {

int exit_at_once(void*) {
    return 0;
}

}  // namespace

bool namespaces_available() {
    // A child made with the namespace flags, as the helper makes sandboxes. (Not fork() then
    // unshare(): unshare(CLONE_NEWUSER) needs a single-threaded caller, and under ThreadSanitizer
    // a forked child is not one: the runtime restarts its background thread in it.)
    static const bool available = [] {
        alignas(16) static char stack[64 * 1024];
        const pid_t child =
            ::clone(exit_at_once, stack + sizeof stack,
                    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | SIGCHLD, nullptr);
        if (child < 0) return false;
        int status = 0;
        ::waitpid(child, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }();
    if (!available) {
        const char* required = std::getenv("MOAT_REQUIRE_NAMESPACES");
        if (required != nullptr && std::string(required) == "1") {
            FAIL("namespaces are unavailable but MOAT_REQUIRE_NAMESPACES=1");
        }
    }
    return available;
}

local_fixture::local_fixture() : local(make_local_backend(io.get_executor())) {}

local_fixture::~local_fixture() {
    shut_down();
}

void local_fixture::shut_down() {
    if (tasks.size() > 0) {
        tasks.cancel_all();
        const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (tasks.size() > 0 && std::chrono::steady_clock::now() < limit) {
            io.run_one_for(std::chrono::milliseconds(100));
        }
    }
    local.reset();
    io.run_for(std::chrono::seconds(2));
}

sandbox_info local_fixture::create(sandbox_spec spec) {
    auto made = run(local->async_create(std::move(spec)));
    if (!made) FAIL("create failed: " << made.error().to_string());
    return *made;
}

exec_result local_fixture::sh(const std::string& id, const std::string& shell,
                              std::chrono::milliseconds wall_limit) {
    exec_request request;
    request.shell = shell;
    request.wall_limit = wall_limit;
    auto r = run(local->async_exec(id, std::move(request)));
    if (!r) FAIL("exec of `" << shell << "` failed: " << r.error().to_string());
    return *r;
}

void local_fixture::destroy(const std::string& id) {
    auto r = run(local->async_destroy(id));
    if (!r) FAIL("destroy failed: " << r.error().to_string());
}

}  // namespace moat::test
