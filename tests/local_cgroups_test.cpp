// The local backend's cgroup limits, checked from the host in the cgroup files themselves, on
// whichever cgroup version this host gives moat: v1 here (hybrid hosts keep v1 for limits), v2 in
// the User-Mode Linux guest (tests/guest), which sets MOAT_EXPECT_CGROUP=v2 so that a sandbox that
// silently fell back to v1 or to no cgroup fails these tests instead of passing them.
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <string>

using namespace std::chrono_literals;

namespace {

// This host's limits are cgroup v2 ones when /sys/fs/cgroup is the unified hierarchy.
bool unified_host() {
    return ::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
}

// The version this run must see: MOAT_EXPECT_CGROUP when set, else what the host has.
void require_expected_version() {
    const char* expected = std::getenv("MOAT_EXPECT_CGROUP");
    if (expected == nullptr || *expected == '\0') return;
    REQUIRE_MESSAGE(std::string(expected) == (unified_host() ? "v2" : "v1"),
                    "this host's cgroup layout is not the expected one");
}

std::string first_line(const std::string& path) {
    std::string text = moat::test::read_file(path);
    if (const auto newline = text.find('\n'); newline != std::string::npos) text.resize(newline);
    return text;
}

// `key`'s value in a flat keyed cgroup file (cpu.stat, memory.events, cgroup.events), or -1.
long long keyed(const std::string& path, const std::string& key) {
    std::istringstream in(moat::test::read_file(path));
    std::string name;
    long long value = 0;
    while (in >> name >> value) {
        if (name == key) return value;
    }
    return -1;
}

bool has_layer(const moat::sandbox_info& info, const char* layer) {
    return std::find(info.layers.begin(), info.layers.end(), layer) != info.layers.end();
}

}  // namespace

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a sandbox's limits are written to the cgroup version the host gives moat") {
    MOAT_REQUIRE_NAMESPACES();
    require_expected_version();
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = 200ull << 20;
    spec.limits.pids = 50;
    spec.limits.cpu_millicores = 500;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    for (const char* layer : {"cgroup_memory", "cgroup_pids", "cgroup_cpu"}) {
        CHECK_MESSAGE(has_layer(box, layer), layer);
    }
    const std::string memory = moat::test::cgroup_dir(init, "memory");
    const std::string pids = moat::test::cgroup_dir(init, "pids");
    const std::string cpu = moat::test::cgroup_dir(init, "cpu");
    REQUIRE(memory.ends_with("/" + box.id));
    REQUIRE(pids.ends_with("/" + box.id));
    REQUIRE(cpu.ends_with("/" + box.id));
    if (unified_host()) {
        CHECK(memory == pids);
        CHECK(memory == cpu);
        CHECK(first_line(memory + "/memory.max") == std::to_string(200ull << 20));
        if (::access((memory + "/memory.swap.max").c_str(), F_OK) == 0) {
            CHECK(first_line(memory + "/memory.swap.max") == "0");
        }
        CHECK(first_line(pids + "/pids.max") == "50");
        CHECK(first_line(cpu + "/cpu.max") == "50000 100000");
        // pid 1 alone in its leaf; commands in theirs, one OOM group.
        CHECK(first_line(memory + "/init/cgroup.procs") == std::to_string(init));
        CHECK(first_line(memory + "/commands/memory.oom.group") == "1");
        auto stream = run(local->async_exec_stream(box.id, moat::test::shell("exec sleep 1000")));
        REQUIRE(stream);
        pid_t sleeper = -1;
        CHECK(moat::test::eventually([&] {
            sleeper = moat::test::find_descendant(init, "sleep 1000");
            return sleeper > 0;
        }));
        const std::string own = first_line("/proc/" + std::to_string(sleeper) + "/cgroup");
        // An exec runs in a cgroup of its own below commands (per-command cgroups).
        CHECK_MESSAGE(own.find("/" + box.id + "/commands/c") != std::string::npos, own);
    } else {
        CHECK(first_line(memory + "/memory.limit_in_bytes") == std::to_string(200ull << 20));
        CHECK(first_line(pids + "/pids.max") == "50");
        CHECK(first_line(cpu + "/cpu.cfs_quota_us") == "50000");
        CHECK(first_line(cpu + "/cpu.cfs_period_us") == "100000");
        CHECK(first_line(pids + "/cgroup.procs") == std::to_string(init));
    }
    destroy(box.id);  // returns once the cgroups are gone
    CHECK(::access(memory.c_str(), F_OK) != 0);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a memory bomb is OOM-killed and reported as such while pid 1 lives on") {
    MOAT_REQUIRE_NAMESPACES();
    require_expected_version();
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = 64ull << 20;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    moat::exec_request bomb;
    bomb.argv = {"python3", "-c",
                 "b = bytearray(256 * 1024**2)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                 "print('allocated')"};
    bomb.wall_limit = 120s;
    const auto killed = run(local->async_exec(box.id, bomb));
    REQUIRE(killed);
    CHECK(killed->oom_killed);
    CHECK(killed->signal == SIGKILL);
    CHECK(killed->out.text().find("allocated") == std::string::npos);
    const std::string memory = moat::test::cgroup_dir(init, "memory");
    if (unified_host()) {
        CHECK(keyed(memory + "/memory.events", "oom_kill") >= 1);
        CHECK(keyed(memory + "/commands/memory.events", "oom_group_kill") >= 1);
    }
    CHECK(moat::test::is_running(init));
    const auto after = sh(box.id, "echo fine");
    CHECK(after.out.text() == "fine\n");
    CHECK_FALSE(after.oom_killed);
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture, "a busy loop under a cpu quota is throttled") {
    MOAT_REQUIRE_NAMESPACES();
    require_expected_version();
    moat::sandbox_spec spec;
    spec.limits.cpu_millicores = 100;  // 10 ms per 100 ms period
    const auto box = create(spec);
    const std::string cpu = moat::test::cgroup_dir(*box.host_pid, "cpu");
    REQUIRE_FALSE(cpu.empty());
    const long long before = keyed(cpu + "/cpu.stat", "nr_throttled");
    REQUIRE(before >= 0);
    const auto r = sh(box.id, "while :; do :; done", 1500ms);
    CHECK(r.timed_out);
    // Counted by the kernel: each period in which the quota ran out.
    CHECK(keyed(cpu + "/cpu.stat", "nr_throttled") > before);
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a wall limit kills the command's whole tree and leaves pid 1 alone" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    require_expected_version();
    const auto box = create();
    const pid_t init = *box.host_pid;
    auto stream = run(local->async_exec_stream(box.id, [] {
        moat::exec_request r;
        r.shell = "setsid sh -c 'sleep 1001 & sleep 1002' & sleep 1000 & echo ready; wait";
        r.wall_limit = 2s;
        return r;
    }()));
    REQUIRE(stream);
    pid_t escaped = -1, inner = -1, child = -1;
    CHECK(moat::test::eventually([&] {
        escaped = moat::test::find_descendant(init, "sleep 1001");
        inner = moat::test::find_descendant(init, "sleep 1002");
        child = moat::test::find_descendant(init, "sleep 1000");
        return escaped > 0 && inner > 0 && child > 0;
    }));
    std::string result_text;
    for (;;) {
        auto next = run(stream->async_next());
        REQUIRE(next);
        if (std::holds_alternative<moat::exec_result>(*next)) {
            CHECK(std::get<moat::exec_result>(*next).timed_out);
            break;
        }
    }
    for (const pid_t p : {escaped, inner, child}) {
        CHECK(moat::test::eventually([&] { return moat::test::is_gone(p); }));
    }
    CHECK(moat::test::is_running(init));
    if (unified_host()) {
        const std::string dir = moat::test::cgroup_dir(init, "pids");
        CHECK(moat::test::eventually(
            [&] { return keyed(dir + "/commands/cgroup.events", "populated") == 0; }));
        CHECK(first_line(dir + "/init/cgroup.procs") == std::to_string(init));
    }
    CHECK(sh(box.id, "echo still-usable").out.text() == "still-usable\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a flood of processes stops at pids.max and the sandbox still works") {
    MOAT_REQUIRE_NAMESPACES();
    require_expected_version();
    moat::sandbox_spec spec;
    spec.limits.pids = 32;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    const std::string pids = moat::test::cgroup_dir(init, "pids");
    REQUIRE_FALSE(pids.empty());
    const long long before = keyed(pids + "/pids.events", "max");
    REQUIRE(before >= 0);
    // 100 forks against a limit of 32: whatever the speed of this machine, some are refused.
    // (The shell may give up at the first refused fork; the kernel counts it either way.)
    const auto r = sh(box.id, "for i in $(seq 100); do sleep 30 & done; echo forked", 120s);
    CHECK_FALSE(r.timed_out);
    CHECK(keyed(pids + "/pids.events", "max") > before);
    // The leftovers die with the command; pid 1 carries on.
    CHECK(moat::test::eventually([&] { return moat::test::descendants(init).empty(); }));
    CHECK(sh(box.id, "echo survived").out.text() == "survived\n");
    destroy(box.id);
}
