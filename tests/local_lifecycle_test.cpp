// Sandbox lifetime: destroy leaves nothing behind, a sandbox dies with its creator, create
// failures are typed.
#include "local/janitor_rules.hpp"
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <fstream>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

int count_mounts(pid_t pid) {
    const std::string info = moat::test::read_file("/proc/" + std::to_string(pid) + "/mountinfo");
    return static_cast<int>(std::count(info.begin(), info.end(), '\n'));
}

pid_t helper_pid() {
    return moat::test::find_descendant(::getpid(), "moat-sandboxd helper");
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "destroy leaves no process, mount, cgroup or directory behind") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    const pid_t helper = helper_pid();
    REQUIRE(helper > 0);
    const int helper_mounts = count_mounts(helper);
    auto stream = run(local->async_exec_stream(box.id, [] {
        moat::exec_request r;
        r.shell = "sleep 1000";
        return r;
    }()));
    REQUIRE(stream);
    pid_t sleeper = -1;
    CHECK(moat::test::eventually([&] {
        sleeper = moat::test::find_descendant(init, "sleep 1000");
        return sleeper > 0;
    }));
    const std::string memory = moat::test::cgroup_dir(init, "memory");
    const std::string pids = moat::test::cgroup_dir(init, "pids");
    REQUIRE(memory.find(box.id) != std::string::npos);
    REQUIRE(pids.find(box.id) != std::string::npos);
    CHECK(exists(memory));
    CHECK(exists(pids));
    CHECK(moat::test::is_running(init));
    CHECK(moat::test::is_running(sleeper));

    destroy(box.id);  // returns only once confirmed

    CHECK(moat::test::is_gone(init));
    CHECK(moat::test::is_gone(sleeper));
    CHECK_FALSE(exists(memory));
    CHECK_FALSE(exists(pids));
    CHECK(count_mounts(helper) == helper_mounts);
    CHECK(moat::test::read_file("/proc/" + std::to_string(helper) + "/mountinfo").find(box.id) ==
          std::string::npos);
    // The stream learns that its sandbox is gone instead of hanging.
    auto next = run(stream->async_next());
    CHECK_FALSE(next.has_value());
    // Destroy again: the id is unknown now.
    auto again = run(local->async_destroy(box.id));
    REQUIRE_FALSE(again);
    CHECK(again.error().code == moat::errc::sandbox_not_found);
}

TEST_CASE("kill -9 of the creating process leaves no sandbox process" * moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    std::string cli = moat::test::moat_cli_path();
    char arg0[] = "moat", arg1[] = "run", arg2[] = "--", arg3[] = "sleep", arg4[] = "1000";
    char* argv[] = {arg0, arg1, arg2, arg3, arg4, nullptr};
    pid_t creator = -1;
    REQUIRE(::posix_spawn(&creator, cli.c_str(), nullptr, nullptr, argv, environ) == 0);
    pid_t sleeper = -1;
    CHECK(moat::test::eventually(
        [&] {
            sleeper = moat::test::find_descendant(creator, "sleep 1000");
            return sleeper > 0;
        },
        20s));
    const auto family = moat::test::descendants(creator);
    REQUIRE(family.size() >= 3);  // helper, the sandbox's pid 1, sleep
    for (const pid_t p : family) CHECK(moat::test::is_running(p));

    // The sandbox's record, found through its pid 1 before the crash.
    local_fixture survivor;
    std::string id;
    std::vector<std::string> cgroups;
    auto listed = survivor.run(survivor.local->async_list({{"moat.cli", "run"}}));
    REQUIRE(listed);
    for (const auto& info : *listed) {
        if (!info.host_pid ||
            std::find(family.begin(), family.end(), *info.host_pid) == family.end())
            continue;
        id = info.id;
        for (const char* controller : {"memory", "pids", "cpu"})
            cgroups.push_back(moat::test::cgroup_dir(*info.host_pid, controller));
    }
    REQUIRE_FALSE(id.empty());

    ::kill(creator, SIGKILL);
    int status = 0;
    ::waitpid(creator, &status, 0);
    for (const pid_t p : family) {
        CHECK(moat::test::eventually([&] { return !moat::test::is_running(p); }));
    }
    // Nobody removed the record: it is recognised as stale, and destroy releases what is left.
    auto info = survivor.run(survivor.local->async_inspect(id));
    REQUIRE(info);
    CHECK(info->state == moat::sandbox_state::exited);
    REQUIRE(survivor.run(survivor.local->async_destroy(id)));
    for (const auto& dir : cgroups) CHECK_MESSAGE(::access(dir.c_str(), F_OK) != 0, dir);
    CHECK_FALSE(survivor.run(survivor.local->async_inspect(id)));
}

TEST_CASE_FIXTURE(local_fixture, "a bad spec fails create with invalid_argument naming the field") {
    moat::sandbox_spec spec;
    spec.layout.workdir = "relative/dir";
    auto r = run(local->async_create(spec));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::invalid_argument);
    CHECK(r.error().detail.find("workdir") != std::string::npos);
    spec = {};
    spec.limits.memory_bytes = 1024;
    r = run(local->async_create(spec));
    REQUIRE_FALSE(r);
    CHECK(r.error().detail.find("memory") != std::string::npos);
    spec = {};
    spec.ttl = 0ms;
    r = run(local->async_create(spec));
    REQUIRE_FALSE(r);
    CHECK(r.error().detail.find("ttl") != std::string::npos);
}

TEST_CASE_FIXTURE(local_fixture, "a sandbox reports the isolation layers it got") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    for (const char* layer : {"user_ns", "pid_ns", "mount_ns", "net_ns", "ipc_ns", "uts_ns",
                              "seccomp", "cgroup_memory", "cgroup_pids", "cgroup_cpu"}) {
        CHECK_MESSAGE(std::find(box.layers.begin(), box.layers.end(), layer) != box.layers.end(),
                      "missing layer " << layer);
    }
    auto info = run(local->async_inspect(box.id));
    REQUIRE(info);
    CHECK(info->state == moat::sandbox_state::running);
    CHECK(info->expires_at > info->created_at);
    destroy(box.id);
}

namespace {

asio::awaitable<void> pause(std::chrono::milliseconds how_long) {
    asio::steady_timer timer(co_await asio::this_coro::executor, how_long);
    co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "a sandbox past its TTL is gone and says so") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.ttl = 1s;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    CHECK(moat::test::is_running(init));
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(init); }, 10s));
    run(pause(300ms));  // let the backend hear about it
    auto info = run(local->async_inspect(box.id));
    REQUIRE(info);
    CHECK(info->state == moat::sandbox_state::exited);
    moat::exec_request request;
    request.shell = "true";
    auto r = run(local->async_exec(box.id, request));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::sandbox_unavailable);
    destroy(box.id);  // destroying what already ended succeeds
}

TEST_CASE_FIXTURE(local_fixture, "destroying the backend ends every sandbox it created") {
    MOAT_REQUIRE_NAMESPACES();
    const auto a = create();
    const auto b = create();
    const pid_t helper = helper_pid();
    REQUIRE(helper > 0);
    for (const pid_t p : {*a.host_pid, *b.host_pid, helper}) CHECK(moat::test::is_running(p));
    local.reset();
    for (const pid_t p : {*a.host_pid, *b.host_pid, helper}) {
        CHECK(moat::test::eventually([&] { return !moat::test::is_running(p); }));
    }
}

TEST_CASE_FIXTURE(local_fixture,
                  "extend_ttl moves the end a sandbox enforces itself" * moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.ttl = 1500ms;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    auto longer = run(local->async_extend_ttl(box.id, 60s));
    REQUIRE_MESSAGE(longer, (longer ? "" : longer.error().to_string()));
    CHECK(longer->expires_at - box.created_at > 50s);
    run(pause(3s));  // past the original TTL
    CHECK(moat::test::is_running(init));
    CHECK(sh(box.id, "echo alive").out.text() == "alive\n");

    auto shorter = run(local->async_extend_ttl(box.id, 200ms));
    REQUIRE(shorter);
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(init); }, 10s));
    run(pause(300ms));  // let the backend hear about it
    auto ended = run(local->async_extend_ttl(box.id, 60s));
    REQUIRE_FALSE(ended);
    CHECK(ended.error().code == moat::errc::sandbox_unavailable);
    destroy(box.id);

    auto unknown = run(local->async_extend_ttl(box.id, 60s));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == moat::errc::sandbox_not_found);
    const auto other = create();
    for (const auto bad :
         {0ms, -5ms, std::chrono::milliseconds(moat::sandbox_spec::max_ttl) + 1ms}) {
        auto refused = run(local->async_extend_ttl(other.id, bad));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
    }
    destroy(other.id);
}

TEST_CASE_FIXTURE(local_fixture, "running out of descriptors fails one request, not the backend") {
    MOAT_REQUIRE_NAMESPACES();
    const auto first = create();
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    // Room for exactly one more descriptor: a create needs three (pidfd, control socket, the
    // root for file access) and an exec three (its pipes and stdin socket).
    int highest = 0;
    for (int fd = 0; fd < 4096; ++fd) {
        if (::fcntl(fd, F_GETFD) >= 0) highest = fd;
    }
    // Fill the holes below it, so the one free number is highest + 1.
    std::vector<int> fillers;
    for (;;) {
        const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        if (fd > highest) {
            ::close(fd);
            break;
        }
        fillers.push_back(fd);
    }
    rlimit tight = saved;
    tight.rlim_cur = static_cast<rlim_t>(highest) + 2;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
    const moat::sandbox_spec spec;
    auto refused = run(local->async_create(spec));
    moat::exec_request request;
    request.shell = "true";
    auto starved = run(local->async_exec(first.id, request));
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
    for (const int fd : fillers) ::close(fd);

    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::limit_exceeded);
    REQUIRE_FALSE(starved);
    CHECK(starved.error().code == moat::errc::limit_exceeded);
    // Everything else still works: the existing sandbox, and new ones.
    CHECK(sh(first.id, "echo still-here").out.text() == "still-here\n");
    const auto second = create();
    CHECK(sh(second.id, "echo new").out.text() == "new\n");
    destroy(first.id);
    destroy(second.id);
}

namespace {
// Sets a path's modification time `age` into the past.
void age_path(const std::string& path, std::chrono::seconds age) {
    timespec times[2] = {};
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - age.count();
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}
}  // namespace

TEST_CASE("the janitor calls a cgroup or socket orphaned only when it is old and empty") {
    MOAT_REQUIRE_NAMESPACES();
    // A create makes its cgroups and attach socket before its record; a sandbox recorded in another
    // state directory has its cgroups under the same parent and no record here.
    const std::string own = moat::test::cgroup_dir(::getpid(), "pids");
    REQUIRE_FALSE(own.empty());
    const std::string parent = own + "/moat-janitor-rules-test";
    const std::string young = parent + "/sb-00000000000000000011";
    const std::string old_empty = parent + "/sb-00000000000000000012";
    const std::string old_busy = parent + "/sb-00000000000000000013";
    const std::string recorded = parent + "/sb-00000000000000000014";
    for (const auto& dir : {parent, young, old_empty, old_busy, old_busy + "/init", recorded})
        REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    for (const auto& dir : {old_empty, old_busy, recorded}) age_path(dir, std::chrono::minutes(2));
    pid_t sleeper = -1;
    char a0[] = "sleep", a1[] = "100";
    char* argv[] = {a0, a1, nullptr};
    REQUIRE(::posix_spawnp(&sleeper, "sleep", nullptr, nullptr, argv, environ) == 0);
    {
        std::ofstream procs(old_busy + "/init/cgroup.procs");
        procs << sleeper << "\n";
    }
    const auto now = std::chrono::system_clock::now();
    auto orphans = moat::orphaned_cgroups({parent}, {"sb-00000000000000000014"}, now);
    CHECK(orphans == std::vector<std::string>{old_empty});
    ::kill(sleeper, SIGKILL);
    ::waitpid(sleeper, nullptr, 0);
    orphans = moat::orphaned_cgroups({parent}, {"sb-00000000000000000014"}, now);
    std::sort(orphans.begin(), orphans.end());
    CHECK(orphans == std::vector<std::string>{old_empty, old_busy});
    for (const auto& dir : {old_busy + "/init", young, old_empty, old_busy, recorded, parent})
        CHECK(::rmdir(dir.c_str()) == 0);

    // Attach sockets: a young one is a create under way.
    char dir_template[] = "/tmp/moat-janitor-files-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    const std::string dir = dir_template;
    const std::string young_sock = dir + "/sb-00000000000000000021.sock";
    const std::string old_sock = dir + "/sb-00000000000000000022.sock";
    for (const auto& f : {young_sock, old_sock}) std::ofstream{f} << "";
    age_path(old_sock, std::chrono::minutes(2));
    CHECK(moat::orphaned_files(dir, {}, std::chrono::system_clock::now()) ==
          std::vector<std::string>{old_sock});
    for (const auto& f : {young_sock, old_sock}) ::unlink(f.c_str());
    ::rmdir(dir.c_str());
}
