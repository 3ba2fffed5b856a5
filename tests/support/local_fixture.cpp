#include "support/local_fixture.hpp"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>

namespace moat::test {

bool namespaces_available() {
    static const bool available = [] {
        const pid_t child = ::fork();
        if (child == 0) {
            _exit(::unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET) == 0 ? 0
                                                                                            : 1);
        }
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
