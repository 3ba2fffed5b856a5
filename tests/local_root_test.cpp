// The sandbox's root (exec_request::as_root, file_write::as_root) and `sudo`
// (sandbox_spec::allow_sudo) on the real local backend: root's identity and its exact capability
// set, what it owns, what stays closed to it (pid 1's /proc files, a half-started command's
// memory, raw sockets, mounts, namespaces, device nodes), and the sudo shim's behaviour as a
// command (exit status, stdin and stdout, signals, options, its refusals and its bounds).
#include <doctest/doctest.h>

#include <moat/backend.hpp>
#include <moat/runtime.hpp>

#include "support/local_fixture.hpp"

#include <string>
#include <vector>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// The capability set of a root command: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID,
// SETUID, SETPCAP, NET_BIND_SERVICE, as /proc/self/status prints it.
constexpr const char* root_caps = "00000000000005fb";

struct root_fixture : local_fixture {
    moat::exec_result root_sh(const std::string& id, const std::string& shell,
                              std::chrono::milliseconds wall_limit = 60s) {
        moat::exec_request request;
        request.shell = shell;
        request.as_root = true;
        request.wall_limit = wall_limit;
        auto r = run(local->async_exec(id, std::move(request)));
        if (!r) FAIL("root exec of `" << shell << "` failed: " << r.error().to_string());
        return *r;
    }

    moat::sandbox_info create_with_sudo(bool allowed) {
        moat::sandbox_spec spec;
        spec.allow_sudo = allowed;
        spec.labels["test"] = "root";
        return create(spec);
    }
};

std::string status_caps() {
    return "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status";
}

std::string expected_caps(const std::string& set) {
    return "CapInh:\t0000000000000000\nCapPrm:\t" + set + "\nCapEff:\t" + set + "\nCapBnd:\t" +
           set + "\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
}

}  // namespace

TEST_CASE_FIXTURE(root_fixture, "as_root runs as the sandbox's uid 0 with exactly root's set") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    CHECK(root_sh(box.id, "id -u; id -g; id -G; echo $HOME").out.text() == "0\n0\n0\n/root\n");
    CHECK(root_sh(box.id, status_caps()).out.text() == expected_caps(root_caps));
    // What the sandbox's user runs keeps nothing at all, its bounding set included.
    CHECK(sh(box.id, "id -u; " + status_caps()).out.text() ==
          "1000\n" + expected_caps("0000000000000000"));
    // A program root runs gets the same set (no file capabilities, no_new_privs).
    CHECK(root_sh(box.id, "sh -c 'grep CapEff /proc/self/status'").out.text() ==
          std::string("CapEff:\t") + root_caps + "\n");
}

TEST_CASE_FIXTURE(root_fixture, "root owns what it writes and uid 1000 cannot change it") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // /root is root's home: a tmpfs of its own that only root writes.
    CHECK(sh(box.id, "stat -c '%u:%g %a' /root").out.text() == "0:0 755\n");
    CHECK(root_sh(box.id,
                  "echo secret > /root/made && chmod 644 /root/made && "
                  "echo kept > /workspace/root-file && stat -c '%u:%g' /workspace/root-file")
              .out.text() == "0:0\n");
    CHECK(sh(box.id, "echo changed > /workspace/root-file").exit_code != 0);
    CHECK(sh(box.id, "echo changed > /root/made").exit_code != 0);
    CHECK(sh(box.id, "touch /root/new").exit_code != 0);
    CHECK(sh(box.id, "chmod 666 /workspace/root-file").exit_code != 0);
    CHECK(sh(box.id, "cat /workspace/root-file /root/made").out.text() == "kept\nsecret\n");
    // Root may change what the user owns (DAC_OVERRIDE, FOWNER, CHOWN), inside the sandbox.
    CHECK(sh(box.id, "echo mine > /workspace/user-file && chmod 600 /workspace/user-file")
              .exit_code == 0);
    CHECK(root_sh(box.id,
                  "cat /workspace/user-file && chown 0:0 /workspace/user-file && "
                  "stat -c '%u' /workspace/user-file")
              .out.text() == "mine\n0\n");

    // The file API as root: the file is root's, the user cannot replace its content.
    std::vector<moat::file_write> files{{"/root/api.txt", "from the host", 0644}};
    files.front().as_root = true;
    auto written = run(local->async_write_files(box.id, files));
    REQUIRE(written);
    REQUIRE(written->front().outcome);
    CHECK(sh(box.id, "stat -c '%u:%g %a' /root/api.txt; cat /root/api.txt").out.text() ==
          "0:0 644\nfrom the host");
    CHECK(sh(box.id, "echo x > /root/api.txt").exit_code != 0);
    // Without as_root the same write is the user's, refused in root's home.
    files.front().as_root = false;
    written = run(local->async_write_files(box.id, files));
    REQUIRE(written);
    CHECK(written->front().outcome.error().code == moat::errc::permission_denied);
}

TEST_CASE_FIXTURE(root_fixture, "pid 1's memory, environment and descriptors stay closed to root") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string probe =
        "for f in /proc/1/mem /proc/1/environ /proc/1/maps; do "
        "  if cat $f >/dev/null 2>&1; then echo open $f; fi; done; "
        "for fd in /proc/1/fd/*; do "
        "  if cat $fd </dev/null >/dev/null 2>&1; then echo open $fd; fi; "
        "  readlink $fd && echo link $fd; done; "
        "grep -q '^State' /proc/1/status && echo status readable; "
        "echo done";
    const auto box = create();
    CHECK(root_sh(box.id, probe).out.text() == "status readable\ndone\n");
}

TEST_CASE_FIXTURE(root_fixture, "a half-started command's memory stays closed to root") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create_with_sudo(true);
    // pid 1 starts root commands for sudo while a root process looks for its children before
    // their exec (they still carry pid 1's name) and tries their memory. pid 1's binary is static
    // and not position-independent (the shim at /opt/moat/bin/sudo is a copy of it), so its text
    // is at 0x401000 in pid 1's memory, and a child's memory read there is pid 1's; after the
    // exec (`true`, position-independent) nothing is mapped there.
    const std::string script = R"(
import os, subprocess, time
with open('/opt/moat/bin/sudo', 'rb') as f:
    f.seek(0x1000)
    text = f.read(64)
starters = [subprocess.Popen(['sh', '-c', 'for i in $(seq 40); do sudo true; done'])
            for _ in range(3)]
seen = opened = leaked = 0
end = time.time() + 20
while time.time() < end and any(p.poll() is None for p in starters):
    for name in os.listdir('/proc'):
        if not name.isdigit() or name == '1':
            continue
        try:
            with open('/proc/%s/comm' % name) as f:
                if f.read().strip() != 'moat-agent':
                    continue
        except OSError:
            continue
        seen += 1
        try:
            fd = os.open('/proc/%s/mem' % name, os.O_RDONLY)
        except OSError:
            continue
        opened += 1  # only after its exec: the command's own memory
        try:
            if os.pread(fd, 64, 0x401000) == text:
                leaked += 1
        except OSError:
            pass
        os.close(fd)
for p in starters:
    p.wait()
print('leaked', leaked)
print('seen', seen, 'opened after exec', opened, flush=True)
)";
    moat::exec_request request;
    request.argv = {"python3", "-c", script};
    request.as_root = true;
    auto r = run(local->async_exec(box.id, std::move(request)));
    REQUIRE(r);
    MESSAGE(r->out.text());
    CHECK(r->out.text().starts_with("leaked 0\n"));
}

TEST_CASE_FIXTURE(root_fixture, "root gets no raw sockets, mounts, namespaces or device nodes") {
    MOAT_REQUIRE_NAMESPACES();
    moat::exec_request raw;
    raw.argv = {"python3", "-c",
                "import socket\n"
                "try:\n"
                "    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n"
                "    print('raw socket')\n"
                "except OSError as e:\n"
                "    print('refused', e.errno)\n"};
    raw.as_root = true;
    const auto box = create();
    auto refused = run(local->async_exec(box.id, raw));
    REQUIRE(refused);
    CHECK(refused->out.text() == "refused 1\n");  // EPERM: no NET_RAW
    CHECK(root_sh(box.id, "mount -t tmpfs none /mnt").exit_code != 0);
    CHECK(root_sh(box.id, "unshare -U true").exit_code != 0);
    CHECK(root_sh(box.id, "chroot / true").exit_code != 0);
    CHECK(root_sh(box.id, "mknod /tmp/null c 1 3").exit_code != 0);
    CHECK(root_sh(box.id, "hostname other").exit_code != 0);
    CHECK(root_sh(box.id, "echo 1 > /proc/sys/kernel/ns_last_pid").exit_code != 0);
    // Root of the sandbox only: the host's files stay someone else's.
    CHECK(root_sh(box.id, "touch /usr/bin/planted").exit_code != 0);
    CHECK(root_sh(box.id, "chown 0 /usr/bin/env").exit_code != 0);
    CHECK(root_sh(box.id, "chown 0 /etc/ssl/certs").exit_code != 0);
}

TEST_CASE_FIXTURE(root_fixture,
                  "root changes its own root by copy-up, and neither the template root nor "
                  "another sandbox sees it") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto other = create();
    const auto before = sh(other.id, "cat /etc/passwd; ls -A /").out.text();
    CHECK(root_sh(box.id,
                  "echo 'extra:x:1001:1001::/:/bin/sh' >> /etc/passwd && mkdir /data && "
                  "echo kept > /data/f && chown 1000 /data && chown 1000 /etc/hosts")
              .exit_code == 0);
    CHECK(sh(box.id,
             "tail -1 /etc/passwd; cat /data/f; stat -c %u /data /etc/hosts; "
             "touch /data/mine && echo user-writes")
              .out.text() == "extra:x:1001:1001::/:/bin/sh\nkept\n1000\n1000\nuser-writes\n");
    // uid 1000 still cannot write where root owns.
    CHECK(sh(box.id, "touch /newfile").exit_code != 0);
    CHECK(sh(box.id, "echo x >> /etc/group").exit_code != 0);
    // The other sandbox, made from the same template root, is as it was.
    CHECK(sh(other.id, "cat /etc/passwd; ls -A /").out.text() == before);
    CHECK(sh(other.id, "test -e /data || echo absent").out.text() == "absent\n");
    destroy(box.id);
    destroy(other.id);
}

TEST_CASE_FIXTURE(root_fixture, "sudo runs its command as root when the sandbox allows it") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create_with_sudo(true);
    CHECK(sh(box.id, "sudo id -u").out.text() == "0\n");
    CHECK(sh(box.id, "sudo grep CapEff /proc/self/status").out.text() ==
          std::string("CapEff:\t") + root_caps + "\n");
    // Exit status, stdin, stdout and stderr are the command's.
    CHECK(sh(box.id, "sudo sh -c 'exit 7'").exit_code == 7);
    CHECK(sh(box.id, "echo hello | sudo cat").out.text() == "hello\n");
    const auto both = sh(box.id, "sudo sh -c 'echo out; echo err >&2'");
    CHECK(both.out.text() == "out\n");
    CHECK(both.err.text() == "err\n");
    // A signal that ends the command ends sudo the same way; a signal sudo gets is passed on.
    CHECK(sh(box.id, "sudo sh -c 'kill -TERM $$'; echo $?").out.text() == "143\n");
    CHECK(sh(box.id, "sudo sleep 30 & pid=$!; sleep 0.5; kill -INT $pid; wait $pid; echo $?")
              .out.text() == "130\n");
    // Options: -E keeps the environment, -u root, -n, NAME=VALUE, --; unknown ones fail.
    CHECK(sh(box.id, "FOO=bar sudo -E sh -c 'echo $FOO $HOME'").out.text() == "bar /workspace\n");
    CHECK(sh(box.id, "FOO=bar sudo sh -c 'echo \"[$FOO]\" $HOME $USER $SUDO_USER'").out.text() ==
          "[] /root root user\n");
    CHECK(sh(box.id, "sudo -n -u root -- id -un").out.text() == "root\n");
    CHECK(sh(box.id, "sudo -En id -u").out.text() == "0\n");
    CHECK(sh(box.id, "sudo BAR=baz sh -c 'echo $BAR'").out.text() == "baz\n");
    const auto unknown = sh(box.id, "sudo -k id");
    CHECK(unknown.exit_code == 1);
    CHECK(unknown.err.text().find("invalid option -- 'k'") != std::string::npos);
    const auto other = sh(box.id, "sudo -u nobody id");
    CHECK(other.exit_code == 1);
    CHECK(other.err.text().find("only root") != std::string::npos);
    const auto missing = sh(box.id, "sudo no-such-program");
    CHECK(missing.exit_code == 1);
    CHECK(missing.err.text() == "sudo: no-such-program: command not found\n");
    CHECK(sh(box.id, "sudo").exit_code == 1);
    // What sudo's command writes is root's.
    CHECK(sh(box.id, "sudo touch /workspace/by-sudo; stat -c %u /workspace/by-sudo").out.text() ==
          "0\n");
}

TEST_CASE_FIXTURE(root_fixture, "sudo is refused where the sandbox does not allow it") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create_with_sudo(false);
    const auto refused = sh(box.id, "sudo id -u");
    CHECK(refused.exit_code == 1);
    CHECK(refused.out.text().empty());
    CHECK(refused.err.text() ==
          "sudo: not allowed in this sandbox (it was created without allow_sudo)\n");
    // Root through the library still works: allow_sudo is about what runs inside.
    CHECK(root_sh(box.id, "id -u").out.text() == "0\n");
}

TEST_CASE_FIXTURE(root_fixture, "sudo requests are bounded in number and in time") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create_with_sudo(true);
    // At most 8 at once: of 10 started together, 2 are told why.
    const auto many = sh(box.id,
                         "for i in 1 2 3 4 5 6 7 8 9 10; do sudo sleep 3 2>>/tmp/err & done; "
                         "wait; grep -c 'too many sudo commands' /tmp/err");
    CHECK(many.out.text() == "2\n");
    // A connection that sends no request within 5 s is closed.
    const auto idle = sh(box.id, R"(python3 -c "
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect('\0moat-sudo')
start = time.time()
data = s.recv(512)
print(len(data), round(time.time() - start))
")");
    CHECK((idle.out.text() == "0 5\n" || idle.out.text() == "0 6\n"));
}
