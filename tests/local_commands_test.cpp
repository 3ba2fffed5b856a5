// A command's processes end with it, whatever else runs in the sandbox (per-command cgroups);
// pid 1 never depends on sandbox code; an expired sandbox ends even if its pid 1 is stuck. Checked
// from the host in /proc and the cgroup tree, never by timing.
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <moat/with_timeout.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

bool has_layer(const moat::sandbox_info& info, const char* layer) {
    return std::find(info.layers.begin(), info.layers.end(), layer) != info.layers.end();
}

// Per-command cgroups need a cgroup2 mount (this host's unified hierarchy, or the guest's).
bool host_has_cgroup2() {
    std::ifstream mounts("/proc/self/mounts");
    std::string device, point, type;
    std::string rest;
    while (mounts >> device >> point >> type && std::getline(mounts, rest)) {
        if (type == "cgroup2") return true;
    }
    return false;
}

// Ends the test case with a message where per-command cgroups cannot exist.
#define MOAT_SKIP_WITHOUT_CGROUP2()                                                             \
    do {                                                                                        \
        if (!host_has_cgroup2()) {                                                              \
            MESSAGE(                                                                            \
                "SKIPPED: no cgroup2 mount: per-command cgroups are unavailable on this host"); \
            return;                                                                             \
        }                                                                                       \
    } while (false)

// The sandbox's cgroup2 directory of `init` (the host pid of pid 1): <mount><path>, or "".
std::string unified_cgroup_of(pid_t init) {
    std::string mount;
    {
        std::ifstream mounts("/proc/self/mounts");
        std::string device, point, type, rest;
        while (mounts >> device >> point >> type && std::getline(mounts, rest)) {
            if (type == "cgroup2") {
                mount = point;
                break;
            }
        }
    }
    std::ifstream cgroup("/proc/" + std::to_string(init) + "/cgroup");
    std::string line;
    while (std::getline(cgroup, line)) {
        if (line.starts_with("0::")) return mount + line.substr(3);
    }
    return "";
}

// Subdirectories of `dir` (cgroups below it).
std::vector<std::string> child_cgroups(const std::string& dir) {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return out;
    while (const dirent* e = ::readdir(d)) {
        if (e->d_type == DT_DIR && e->d_name[0] != '.') out.emplace_back(e->d_name);
    }
    ::closedir(d);
    return out;
}

bool exists(const std::string& path) {
    return ::access(path.c_str(), F_OK) == 0;
}

// A long-running spawned process, as the tool layer's Python interpreter is: with one running,
// "no other command runs" never holds in the sandbox.
moat::process spawn_service(moat::test::local_fixture& f, const std::string& id,
                            const std::string& command) {
    auto spawned = f.run(f.local->async_spawn(id, moat::test::shell(command)));
    REQUIRE(spawned);
    return std::move(*spawned);
}

asio::awaitable<moat::result<moat::exec_result>> exec_within(moat::backend& local, std::string id,
                                                             moat::exec_request request,
                                                             std::chrono::milliseconds limit) {
    auto exec = local.async_exec(std::move(id), std::move(request));
    co_return co_await moat::with_timeout(std::move(exec), moat::deadline::after(limit));
}

}  // namespace

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a process an exec started with setsid is killed when the exec ends, while a "
                  "spawned service keeps running") {
    MOAT_REQUIRE_NAMESPACES();
    MOAT_SKIP_WITHOUT_CGROUP2();
    const auto box = create();
    REQUIRE(has_layer(box, "command_cgroups"));
    const pid_t init = *box.host_pid;
    auto service = spawn_service(*this, box.id, "exec sleep 4141");
    REQUIRE(moat::test::eventually(
        [&] { return moat::test::find_descendant(init, "sleep 4141") > 0; }));

    const auto r = sh(box.id, "setsid sleep 4242 >/dev/null 2>&1 & sleep 0.3; echo started");
    CHECK(r.exit_code == 0);
    CHECK(r.out.text() == "started\n");
    CHECK(r.strays_killed);
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(init, "sleep 4242") < 0; }));
    // A double fork (the stray's parent exits first) ends the same way.
    const auto twice = sh(box.id, "(setsid sh -c 'sleep 4244' >/dev/null 2>&1 &) ; echo forked");
    CHECK(twice.out.text() == "forked\n");
    CHECK(twice.strays_killed);
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(init, "sleep 4244") < 0; }));

    // An exec that leaves nothing behind says so.
    CHECK_FALSE(sh(box.id, "echo quiet").strays_killed);
    // The spawned service outlived both execs and runs until its own end.
    CHECK(moat::test::find_descendant(init, "sleep 4141") > 0);
    CHECK(run(service.async_signal(SIGTERM)));
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "an exec whose escaped process holds its output pipe returns when its main "
                  "process ends, long before its wall limit") {
    MOAT_REQUIRE_NAMESPACES();
    MOAT_SKIP_WITHOUT_CGROUP2();
    const auto box = create();
    const pid_t init = *box.host_pid;
    auto service = spawn_service(*this, box.id, "exec sleep 4141");
    auto request = moat::test::shell("setsid sleep 4343 & sleep 0.3; echo started");
    request.wall_limit = 30s;
    // Before: the stray held stdout, and the exec ended only at its wall limit plus the slack
    // (35 s). The bound here is far below that, and the result must be the command's own.
    const auto r = run(exec_within(*local, box.id, std::move(request), 15s));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
    CHECK_FALSE(r->timed_out);
    CHECK(r->out.text() == "started\n");
    CHECK(r->strays_killed);
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(init, "sleep 4343") < 0; }));
    CHECK(run(service.async_signal(SIGKILL)));
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "per-command cgroups are reused, never pile up, and are gone after destroy") {
    MOAT_REQUIRE_NAMESPACES();
    MOAT_SKIP_WITHOUT_CGROUP2();
    const auto box = create();
    const pid_t init = *box.host_pid;
    const std::string init_dir = unified_cgroup_of(init);
    REQUIRE(init_dir.ends_with("/" + box.id + "/init"));
    const std::string top = init_dir.substr(0, init_dir.size() - 5);
    const std::string commands = top + "/commands";
    REQUIRE(exists(commands));
    for (int i = 0; i < 40; ++i) {
        const auto r = sh(box.id, i % 2 == 0 ? "true" : "sleep 5 >/dev/null 2>&1 & echo");
        REQUIRE(r.exit_code == 0);
    }
    // The agent keeps at most a few empty ones for reuse, and removes the ones it killed once
    // they have emptied: 40 execs, half of them leaving a stray, end with no more than that.
    const auto settled = [&] {
        const auto left = child_cgroups(commands);
        if (left.size() > 4) return false;
        for (const auto& name : left) {
            if (!moat::test::read_file(commands + "/" + name + "/cgroup.procs").empty())
                return false;
        }
        return true;
    };
    CHECK(moat::test::eventually(settled));
    destroy(box.id);
    CHECK(moat::test::eventually([&] { return !exists(top); }));
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "sandbox code stopping every process it can does not freeze pid 1") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // The stopper signals every process of the sandbox's uid but itself, as fast as it can: each
    // command it catches between the agent's uid change and exec used to hold pid 1 in its
    // vfork wait, uninterruptibly, for good.
    auto stopper = spawn_service(*this, box.id,
                                 "exec python3 -c 'import os, signal\n"
                                 "while True:\n"
                                 "    try: os.kill(-1, signal.SIGSTOP)\n"
                                 "    except OSError: pass'");
    int answered = 0;
    for (int i = 0; i < 30; ++i) {
        auto request = moat::test::shell("true");
        request.wall_limit = 300ms;
        // Stopped commands are killed at their wall limit: a result either way, within a bound
        // far above it. A frozen pid 1 answers nothing and the bound passes.
        const auto r = run(exec_within(*local, box.id, std::move(request), 10s));
        REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
        ++answered;
    }
    CHECK(answered == 30);
    CHECK(run(stopper.async_signal(SIGKILL)));
    const auto inspected =
        run(moat::with_timeout(local->async_inspect(box.id), moat::deadline::after(10s)));
    REQUIRE(inspected);
    CHECK(inspected->state == moat::sandbox_state::running);
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a sandbox whose pid 1 is stopped still ends at its TTL") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.ttl = 2s;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, init, 0));
    REQUIRE(pidfd >= 0);
    // A stopped pid 1 enforces nothing: only something outside the sandbox can end it now.
    REQUIRE(::kill(init, SIGSTOP) == 0);
    const bool ended = moat::test::eventually([&] { return moat::test::is_gone(init); }, 15s);
    if (!ended) ::kill(init, SIGKILL);
    ::close(pidfd);
    CHECK(ended);
    const auto inspected = run(local->async_inspect(box.id));
    CHECK((!inspected || inspected->state != moat::sandbox_state::running));
}

TEST_CASE("a survivor's per-command cgroups are gone after another backend destroys it") {
    MOAT_REQUIRE_NAMESPACES();
    MOAT_SKIP_WITHOUT_CGROUP2();
    moat::test::local_fixture creator;
    moat::sandbox_spec spec;
    spec.survive_owner = true;
    spec.ttl = 10min;
    const auto box = creator.create(spec);
    const std::string init_dir = unified_cgroup_of(*box.host_pid);
    REQUIRE(init_dir.ends_with("/" + box.id + "/init"));
    const std::string top = init_dir.substr(0, init_dir.size() - 5);
    CHECK(creator.sh(box.id, "sleep 100 >/dev/null 2>&1 & echo").strays_killed);
    creator.shut_down();  // its helper is gone: it cannot remove them

    moat::test::local_fixture other;
    REQUIRE(other.run(other.local->async_attach(box.id)));
    REQUIRE(other.run(other.local->async_destroy(box.id)));
    CHECK(moat::test::eventually([&] { return !exists(top); }));
}
