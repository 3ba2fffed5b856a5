// The cgroup layout parser (src/sandboxd/cgroup_layout.cpp) on the files of real hosts: these
// machines (hybrid), a stock v2 host, and a container with its own cgroup namespace.
#include <doctest/doctest.h>

#include "sandboxd/cgroup_layout.hpp"

namespace {

using moat::sandboxd::cgroup_layout_kind;
using moat::sandboxd::controller;
using moat::sandboxd::parse_cgroup_layout;

// /proc/self/mountinfo and /proc/self/cgroup of the machines this project is built on.
constexpr const char* hybrid_mountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
constexpr const char* hybrid_cgroup =
    "8:pids:/\n4:memory:/process_api/ad0d\n2:cpuacct:/\n1:cpu:/\n0::/\n";

}  // namespace

TEST_CASE("a hybrid host keeps v1 for every limit") {
    const auto layout = parse_cgroup_layout(hybrid_mountinfo, hybrid_cgroup);
    CHECK(layout.kind == cgroup_layout_kind::hybrid);
    CHECK(layout.limits_use_v1());
    CHECK(layout.v1[0].mount_point == "/sys/fs/cgroup/memory");
    CHECK(layout.v1[0].own == "/process_api/ad0d");
    CHECK(layout.v1[1].mount_point == "/sys/fs/cgroup/pids");
    CHECK(layout.v1[1].own.empty());
    CHECK(layout.v1[2].mount_point == "/sys/fs/cgroup/cpu");  // not cpuacct
    CHECK(layout.v2_mount == "/sys/fs/cgroup/unified");
    CHECK(layout.v2_own_dir() == "/sys/fs/cgroup/unified");
}

TEST_CASE("a unified host is v2 with this process's own cgroup") {
    const auto layout = parse_cgroup_layout(
        "25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 "
        "rw,nsdelegate,memory_recursiveprot\n",
        "0::/system.slice/agent-server.service\n");
    CHECK(layout.kind == cgroup_layout_kind::v2);
    CHECK_FALSE(layout.limits_use_v1());
    CHECK_FALSE(layout.has_v1(controller::memory));
    CHECK(layout.v2_own == "/system.slice/agent-server.service");
    CHECK(layout.v2_own_dir() == "/sys/fs/cgroup/system.slice/agent-server.service");
}

TEST_CASE("inside a cgroup namespace the own cgroup is relative to the mount's root") {
    // A container whose /sys/fs/cgroup shows its own cgroup as the root.
    const auto layout = parse_cgroup_layout(
        "600 590 0:22 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "0::/kubepods/pod1/c1/worker\n");
    CHECK(layout.kind == cgroup_layout_kind::v2);
    CHECK(layout.v2_own == "/worker");
    CHECK(layout.v2_own_dir() == "/sys/fs/cgroup/worker");
}

TEST_CASE("a v1-only host's freezer hierarchy is found, with this process's cgroup in it") {
    // The v1 guest of tests/guest (guest_init_v1.sh), this process in a sub-cgroup of the freezer.
    const auto layout = parse_cgroup_layout(
        "21 19 0:19 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "23 21 0:21 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "24 21 0:22 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "25 21 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "26 21 0:24 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n",
        "4:freezer:/jobs/a\n3:cpu,cpuacct:/\n2:pids:/\n1:memory:/\n");
    CHECK(layout.kind == cgroup_layout_kind::v1);
    CHECK(layout.v2_mount.empty());
    CHECK(layout.freezer.mount_point == "/sys/fs/cgroup/freezer");
    CHECK(layout.freezer.own == "/jobs/a");
    CHECK(layout.freezer.listed);
    // The hybrid host above mounts none.
    CHECK(parse_cgroup_layout(hybrid_mountinfo, hybrid_cgroup).freezer.mount_point.empty());
}

TEST_CASE("no cgroup filesystem is layout none") {
    const auto layout = parse_cgroup_layout("22 1 0:5 / /proc rw - proc proc rw\n", "0::/\n");
    CHECK(layout.kind == cgroup_layout_kind::none);
    CHECK(layout.v2_own_dir().empty());
}

TEST_CASE("cgroup keyed files and word lists are read exactly") {
    using moat::sandboxd::has_word;
    using moat::sandboxd::keyed_value;
    CHECK(keyed_value("populated 1\nfrozen 0\n", "populated") == 1);
    CHECK(keyed_value("populated 1\nfrozen 0\n", "frozen") == 0);
    CHECK(keyed_value("oom_kill_disable 0\noom_kill 3\n", "oom_kill") == 3);
    CHECK(keyed_value("populated 1\n", "missing") == -1);
    CHECK(has_word("cpuset cpu io memory pids\n", "cpu"));
    CHECK_FALSE(has_word("cpuset io memory\n", "cpu"));
}
