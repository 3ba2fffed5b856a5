// What a sandbox can and cannot see or touch. Real namespaces, real processes; every check of the
// host is made from the host.
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <netinet/in.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

using moat::test::local_fixture;

TEST_CASE_FIXTURE(local_fixture, "the host environment is invisible inside") {
    MOAT_REQUIRE_NAMESPACES();
    ::setenv("MOAT_TEST_HOST_SECRET", "s3cr3t-value", 1);
    const auto box = create();
    const auto r = sh(box.id, "env; echo; cat /proc/1/environ 2>&1; true");
    CHECK(r.exit_code == 0);
    CHECK(r.out.text().find("s3cr3t-value") == std::string::npos);
    CHECK(r.out.text().find("MOAT_TEST_HOST_SECRET") == std::string::npos);
    CHECK(r.out.text().find("PATH=/opt/moat/python/bin:/usr/local/bin:/usr/bin:/bin") !=
          std::string::npos);
    CHECK(r.out.text().find("HOME=/workspace") != std::string::npos);
    CHECK(r.out.text().find("LANG=C.UTF-8") != std::string::npos);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "python runs Python 3 in the default root, which stays read-only") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto r = sh(box.id, "python -c 'import sys; print(sys.version_info[0])'");
    CHECK_MESSAGE(r.exit_code == 0, r.err.text());
    CHECK(r.out.text() == "3\n");
    // Where the host has no python of its own, the template's alias is it, read-only like the
    // rest of the root, and last on PATH; the sandbox's Python environment (local_python_env_test)
    // comes first, so `python` is the environment's wherever the host has python3.
    if (::access("/usr/bin/python", F_OK) != 0) {
        CHECK(sh(box.id, "command -v python").out.text() == "/opt/moat/python/bin/python\n");
        CHECK(sh(box.id, "readlink /opt/moat/bin/python").out.text() == "/usr/bin/python3\n");
        CHECK(sh(box.id, "touch /opt/moat/bin/x").exit_code != 0);
        CHECK(sh(box.id, "ln -sf /bin/sh /opt/moat/bin/python").exit_code != 0);
        CHECK(sh(box.id, "echo $PATH").out.text() ==
              "/opt/moat/python/bin:/usr/local/bin:/usr/bin:/bin:/opt/moat/bin\n");
    }
    CHECK(sh(box.id, "touch /opt/newfile").exit_code != 0);
    // pip where the host has a pip3 to point the alias at, and in the Python environment, which
    // every root with python3 gets.
    const bool host_pip3 = ::access("/usr/bin/pip3", X_OK) == 0;
    const bool host_pip = ::access("/usr/bin/pip", F_OK) == 0;
    const bool environment = ::access("/usr/bin/python3", X_OK) == 0;
    CHECK(sh(box.id, "command -v pip >/dev/null").exit_code ==
          (host_pip3 || host_pip || environment ? 0 : 1));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a listener on host loopback is unreachable from inside") {
    MOAT_REQUIRE_NAMESPACES();
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    const int port = ntohs(addr.sin_port);

    const auto box = create();
    const auto r = sh(box.id,
                      "python3 -c \"import socket; s=socket.socket(); s.settimeout(2); "
                      "s.connect(('127.0.0.1', " +
                          std::to_string(port) +
                          ")); print('CONNECTED')\" 2>&1; ip -o link 2>/dev/null; "
                          "cat /proc/net/dev");
    CHECK(r.out.text().find("CONNECTED") == std::string::npos);
    CHECK(r.out.text().find("ConnectionRefusedError") != std::string::npos);
    // Only loopback exists, and it is up (a loopback connection inside works).
    CHECK(r.out.text().find("eth0") == std::string::npos);
    const auto local_net = sh(box.id,
                              "python3 -c \"import socket; s=socket.socket(); "
                              "s.bind(('127.0.0.1', 0)); s.listen(); c=socket.socket(); "
                              "c.connect(s.getsockname()); print('LOOPBACK OK')\"");
    CHECK(local_net.out.text() == "LOOPBACK OK\n");
    ::close(listener);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "only the sandbox's own processes appear in its /proc") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto r = sh(box.id, "for p in /proc/[0-9]*; do echo ${p#/proc/}; done");
    std::istringstream pids(r.out.text());
    int pid = 0, count = 0, highest = 0;
    while (pids >> pid) {
        ++count;
        highest = std::max(highest, pid);
    }
    CHECK(count >= 2);  // pid 1 (the agent) and the shell
    CHECK(count <= 4);
    CHECK(highest < 100);
    CHECK(sh(box.id, "cat /proc/1/cmdline | tr '\\0' ' '").out.text().find("agent") !=
          std::string::npos);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "the root is read-only and /workspace is writable") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    CHECK(sh(box.id, "touch /newfile").exit_code != 0);
    CHECK(sh(box.id, "touch /usr/bin/newfile").exit_code != 0);
    CHECK(sh(box.id, "echo x >> /etc/passwd").exit_code != 0);
    CHECK(sh(box.id, "echo data > /workspace/f && cat /workspace/f").out.text() == "data\n");
    CHECK(sh(box.id, "echo data > /tmp/f && cat /tmp/f").out.text() == "data\n");
    CHECK(sh(box.id, "id -u; id -g").out.text() == "1000\n1000\n");
    CHECK(sh(box.id, "test -e /sys/kernel && echo SYS || echo NOSYS").out.text() == "NOSYS\n");
    CHECK(sh(box.id, "hostname").out.text() == "sandbox\n");
    // No capabilities and no way back to root.
    CHECK(sh(box.id, "grep CapEff /proc/self/status").out.text() == "CapEff:\t0000000000000000\n");
    CHECK(sh(box.id, "grep NoNewPrivs /proc/self/status").out.text() == "NoNewPrivs:\t1\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "rm -rf / inside harms nothing outside") {
    MOAT_REQUIRE_NAMESPACES();
    char dir[] = "/tmp/moat-rmrf-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string marker = std::string(dir) + "/marker";
    std::ofstream(marker) << "still here";
    const auto box = create();
    sh(box.id, "echo mine > /workspace/mine");
    const auto r = sh(box.id, "rm -rf --no-preserve-root / 2>/dev/null; ls -A /workspace | wc -l");
    CHECK(r.out.text() == "0\n");  // it could delete its own files, and only those
    CHECK(moat::test::read_file(marker) == "still here");
    CHECK(::access("/usr/bin/true", X_OK) == 0);
    CHECK(::access("/etc/passwd", R_OK) == 0);
    CHECK(sh(box.id, "echo alive").out.text() == "alive\n");
    destroy(box.id);
    ::unlink(marker.c_str());
    ::rmdir(dir);
}

TEST_CASE_FIXTURE(local_fixture, "a host descriptor opened without CLOEXEC is absent inside") {
    MOAT_REQUIRE_NAMESPACES();
    const int leaked = ::open("/etc/hostname", O_RDONLY);  // deliberately inheritable
    REQUIRE(leaked >= 0);
    const auto box = create();
    // The shell's own fds are 0, 1, 2 and the one ls opens to read the directory.
    const auto r =
        sh(box.id, "ls /proc/self/fd | tr '\\n' ' '; echo; ls -l /proc/1/fd 2>&1 | wc -l");
    CHECK(r.out.text().substr(0, r.out.text().find('\n')) == "0 1 2 3 ");
    // pid 1's descriptors are not readable by commands.
    const auto agent_fds = sh(box.id, "ls /proc/1/fd 2>&1");
    CHECK(agent_fds.exit_code != 0);
    ::close(leaked);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "two sandboxes cannot see each other") {
    MOAT_REQUIRE_NAMESPACES();
    const auto a = create();
    const auto b = create();
    sh(a.id, "echo secret-of-a > /workspace/a.txt; echo tmp-of-a > /tmp/a.txt");
    CHECK(sh(b.id, "cat /workspace/a.txt /tmp/a.txt 2>&1").exit_code != 0);
    // a's pid 1 as the host sees it is not a process b can name.
    const auto r = sh(b.id, "kill -0 " + std::to_string(*a.host_pid) + " 2>&1; echo rc=$?");
    CHECK(r.out.text().find("rc=0") == std::string::npos);
    CHECK(a.host_pid != b.host_pid);
    // Distinct user ranges on the host.
    const auto uid_a = moat::test::read_file("/proc/" + std::to_string(*a.host_pid) + "/uid_map");
    const auto uid_b = moat::test::read_file("/proc/" + std::to_string(*b.host_pid) + "/uid_map");
    CHECK(uid_a != uid_b);
    std::istringstream map(uid_a);
    long inside = -1, outside = -1, count = -1;
    map >> inside >> outside >> count;
    CHECK(inside == 0);
    CHECK(outside >= 65536);  // sandbox root is never host root
    CHECK(count == 65536);
    destroy(a.id);
    destroy(b.id);
}

TEST_CASE_FIXTURE(local_fixture, "socket families beyond unix, inet and netlink are refused") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // AF_VSOCK ignores network namespaces: on a VM guest it would reach the hypervisor host.
    const auto r = sh(box.id,
                      "python3 -c \"import socket\n"
                      "for name in ('AF_VSOCK', 'AF_PACKET', 'AF_ALG'):\n"
                      "    try:\n"
                      "        socket.socket(getattr(socket, name), socket.SOCK_STREAM)\n"
                      "        print(name, 'OPEN')\n"
                      "    except OSError as e:\n"
                      "        print(name, e.errno)\n"
                      "socket.socket(socket.AF_UNIX); socket.socket(socket.AF_INET6)\n"
                      "print('unix and inet6 ok')\"");
    CHECK(r.out.text() == "AF_VSOCK 97\nAF_PACKET 97\nAF_ALG 97\nunix and inet6 ok\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "commands cannot shield themselves from the OOM killer or out-fork their limit") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    CHECK(sh(box.id, "cat /proc/self/oom_score_adj").out.text() == "500\n");
    CHECK(sh(box.id, "echo -1000 > /proc/self/oom_score_adj").exit_code != 0);
    CHECK(sh(box.id,
             "python3 -c \"import resource as r; print(r.getrlimit(r.RLIMIT_NPROC)[0], "
             "r.getrlimit(r.RLIMIT_NOFILE)[0])\"")
              .out.text() == "256 1024\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a sandbox exhausts only its own per-user kernel quotas") {
    MOAT_REQUIRE_NAMESPACES();
    const auto a = create();
    const auto b = create();
    // The user namespace belongs to the sandbox's own host uid, never to root.
    const int ns =
        ::open(("/proc/" + std::to_string(*a.host_pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(ns >= 0);
    uid_t owner = 0;
    REQUIRE(::ioctl(ns, NS_GET_OWNER_UID, &owner) == 0);
    ::close(ns);
    CHECK(owner >= 65536);
    // inotify instances are counted per owner: while one sandbox holds all of its own, root and
    // another sandbox can still make theirs.
    const std::string take_all =
        "import ctypes, time\nlibc = ctypes.CDLL(None)\n"
        "fds = [libc.inotify_init() for _ in range(100000)]\n"
        "print(sum(1 for fd in fds if fd >= 0), flush=True)\n";
    moat::exec_request holding;
    holding.argv = {"python3", "-c", take_all + "time.sleep(30)\n"};
    auto stream = run(local->async_exec_stream(a.id, holding));
    REQUIRE(stream);
    auto first = run(stream->async_next());
    REQUIRE(first);
    const auto* count = std::get_if<moat::output_chunk>(&*first);
    REQUIRE(count != nullptr);
    CHECK(std::stoi(count->data) > 0);
    const int host = ::inotify_init1(IN_CLOEXEC);
    CHECK(host >= 0);
    if (host >= 0) ::close(host);
    moat::exec_request once;
    once.argv = {"python3", "-c", take_all};
    const auto other = run(local->async_exec(b.id, once));
    REQUIRE(other);
    CHECK(other->out.text() == count->data);
    destroy(a.id);
    destroy(b.id);
}
