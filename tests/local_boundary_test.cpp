// The sandbox boundary against the kernel: the seccomp allow-list (each denied family attempted
// for real, on the host without and with the very filter the helper compiles, and inside a
// sandbox), the workloads it must keep working, and the host state a sandbox must not inherit
// (/proc entries, keyrings, the terminal and the session).
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sandboxd/seccomp_filter.hpp"

using moat::test::local_fixture;

namespace {

// Every family the issue names, with the errno the filter must give.
const std::map<std::string, std::string> denied_families = {
    {"ptrace", "EPERM"},
    {"keyctl", "EPERM"},
    {"add_key", "EPERM"},
    {"request_key", "EPERM"},
    {"bpf", "EPERM"},
    {"io_uring_setup", "EPERM"},
    {"io_uring_enter", "EPERM"},
    {"userfaultfd", "EPERM"},
    {"perf_event_open", "EPERM"},
    {"mount", "EPERM"},
    {"umount2", "EPERM"},
    {"pivot_root", "EPERM"},
    {"chroot", "EPERM"},
    {"fsopen", "EPERM"},
    {"fsmount", "EPERM"},
    {"fsconfig", "EPERM"},
    {"fspick", "EPERM"},
    {"move_mount", "EPERM"},
    {"open_tree", "EPERM"},
    {"mount_setattr", "EPERM"},
    {"unshare", "EPERM"},
    {"setns", "EPERM"},
    {"clone_newuser", "EPERM"},
    {"clone3", "ENOSYS"},
    {"statmount", "EPERM"},
    {"listmount", "EPERM"},
    {"process_vm_readv", "EPERM"},
    {"process_vm_writev", "EPERM"},
    {"kexec_load", "EPERM"},
    {"kexec_file_load", "EPERM"},
    {"init_module", "EPERM"},
    {"finit_module", "EPERM"},
    {"delete_module", "EPERM"},
    {"open_by_handle_at", "EPERM"},
    {"name_to_handle_at", "EPERM"},
    {"personality", "EPERM"},
    {"personality_high_bits", "EPERM"},
    {"tiocsti", "EPERM"},
    {"tiocsti_high_bits", "EPERM"},
    {"tioclinux", "EPERM"},
    {"reboot", "EPERM"},
    {"swapon", "EPERM"},
    {"sethostname", "EPERM"},
    {"clock_settime", "EPERM"},
    {"syslog", "EPERM"},
    {"iopl", "EPERM"},
    {"pidfd_getfd", "EPERM"},
    {"kcmp", "EPERM"},
};

// "name=result" lines; "done" must be the last line, so a probe that did not run (exit 127), did
// not compile or died half-way yields no map at all.
std::map<std::string, std::string> parse_probe(const std::string& text) {
    std::map<std::string, std::string> results;
    std::istringstream lines(text);
    std::string line;
    bool done = false;
    while (std::getline(lines, line)) {
        done = line == "done";
        const auto equals = line.find('=');
        if (equals != std::string::npos) results[line.substr(0, equals)] = line.substr(equals + 1);
    }
    if (!done) results.clear();
    return results;
}

std::string probe_source_path() {
    return moat::test::source_dir() + "/tests/boundary/syscall_probe.c";
}

std::string probe_source() {
    return moat::test::read_file(probe_source_path());
}

// Compiles the probe on the host into a fresh directory; returns the binary's path.
std::string compile_probe_on_host() {
    char dir[] = "/tmp/moat-probe-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string binary = std::string(dir) + "/probe";
    const std::string command = "gcc -O0 -o " + binary + " " + probe_source_path() + " 2>&1";
    REQUIRE(std::system(command.c_str()) == 0);
    return binary;
}

// Runs `binary` on the host as this (root) process's child, optionally under `filter` (loaded the
// way a sandbox command has it: no_new_privs, the sandbox's filter, then the command filter every
// command stacks on it), and returns its stdout.
std::string run_on_host(const std::string& binary, const std::vector<sock_filter>* filter) {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    sock_fprog program{};
    sock_fprog command_program{
        static_cast<unsigned short>(std::size(moat::sandboxd::command_filter)),
        const_cast<sock_filter*>(moat::sandboxd::command_filter)};
    if (filter != nullptr) {
        program.len = static_cast<unsigned short>(filter->size());
        program.filter = const_cast<sock_filter*>(filter->data());
    }
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(out[1], 1);
        char* argv[] = {const_cast<char*>(binary.c_str()), nullptr};
        char* envp[] = {nullptr};
        if (filter != nullptr &&
            (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
             ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0 ||
             ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &command_program) != 0)) {
            ::_exit(126);
        }
        ::execve(argv[0], argv, envp);
        ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buffer[4096];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{out[0], POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
        const ssize_t n = ::read(out[0], buffer, sizeof buffer);
        if (n <= 0) break;
        text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return text;
}

// Builds the probe inside the sandbox from the same source (the sandbox's gcc, under the filter)
// and runs it there as the sandbox user, or as the sandbox's root (exec_request::as_root).
std::map<std::string, std::string> probe_inside(local_fixture& f, const std::string& id,
                                                bool as_root = false) {
    auto request = moat::test::shell(
        "cat > /workspace/probe.c && gcc -O0 -o /workspace/probe /workspace/probe.c && "
        "/workspace/probe");
    request.stdin_data = probe_source();
    request.as_root = as_root;
    const auto r = f.run(f.local->async_exec(id, request));
    REQUIRE(r);
    INFO(r->err.text());
    CHECK(r->exit_code == 0);
    return parse_probe(r->out.text());
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "each denied syscall family fails inside, and the probe shows the kernel would "
                  "have answered otherwise") {
    MOAT_REQUIRE_NAMESPACES();
    std::vector<sock_filter> filter;
    std::string detail;
    REQUIRE_MESSAGE(moat::sandboxd::compile_seccomp_filter(filter, detail) == 0, detail);
    const std::string binary = compile_probe_on_host();
    // As root without a filter, each call gets past seccomp and the kernel answers with something
    // else than EPERM (a success, EFAULT, EINVAL, EBADF, ENOSYS...): the probe can tell.
    const auto plain = parse_probe(run_on_host(binary, nullptr));
    // The same probe, as root, under the helper's filter: root's capabilities no longer matter,
    // which covers what an unprivileged sandbox user would be refused anyway (kexec, modules,
    // fsopen, reboot...).
    const auto filtered = parse_probe(run_on_host(binary, &filter));
    const auto box = create();
    const auto inside = probe_inside(*this, box.id);
    // And as the sandbox's root, whose capabilities (in its user namespace) change nothing here.
    const auto inside_root = probe_inside(*this, box.id, true);
    REQUIRE_FALSE(inside_root.empty());
    REQUIRE_FALSE(plain.empty());
    REQUIRE_FALSE(filtered.empty());
    REQUIRE_FALSE(inside.empty());
    // A test run that is itself under a seccomp filter (a container's) has no unfiltered control.
    const bool host_unfiltered =
        moat::test::read_file("/proc/self/status").find("\nSeccomp:\t0\n") != std::string::npos;
    if (!host_unfiltered) MESSAGE("this test process is under a seccomp filter: no plain control");
    for (const auto& [name, expected] : denied_families) {
        INFO(name);
        REQUIRE(plain.count(name) == 1);
        if (host_unfiltered) CHECK(plain.at(name) != expected);
        CHECK(filtered.at(name) == expected);
        CHECK(inside.at(name) == expected);
        CHECK(inside_root.at(name) == expected);
    }
    // A syscall newer than the filter's table is closed with ENOSYS (callers fall back), and an
    // allowed one still works.
    CHECK(filtered.at("future_syscall") == "ENOSYS");
    CHECK(inside.at("future_syscall") == "ENOSYS");
    CHECK(inside.at("getpid") == "ok");
    CHECK(inside_root.at("future_syscall") == "ENOSYS");
    CHECK(inside_root.at("getpid") == "ok");
    destroy(box.id);
    ::unlink(binary.c_str());
    ::rmdir(binary.substr(0, binary.rfind('/')).c_str());
}

TEST_CASE_FIXTURE(local_fixture,
                  "Python's subprocess, multiprocessing, ssl and sqlite3 run under the filter") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // A self-signed certificate made inside, then a real TLS handshake over loopback TCP between
    // two threads, the client verifying the server against it.
    const std::string script = R"PY(
import multiprocessing, socket, sqlite3, ssl, subprocess, threading
print(subprocess.run(['echo', 'child'], capture_output=True, text=True, check=True).stdout.strip())
with multiprocessing.Pool(2) as pool:
    print(sum(pool.map(abs, [-1, -2, -3])))
subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
                '-subj', '/CN=localhost', '-keyout', '/workspace/key.pem',
                '-out', '/workspace/cert.pem'], check=True, capture_output=True)
server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server_ctx.load_cert_chain('/workspace/cert.pem', '/workspace/key.pem')
client_ctx = ssl.create_default_context(cafile='/workspace/cert.pem')
listener = socket.create_server(('127.0.0.1', 0))
def serve():
    conn, _ = listener.accept()
    with server_ctx.wrap_socket(conn, server_side=True) as tls:
        tls.sendall(tls.recv(100).upper())
thread = threading.Thread(target=serve)
thread.start()
with client_ctx.wrap_socket(socket.create_connection(listener.getsockname()),
                            server_hostname='localhost') as tls:
    tls.sendall(b'tls works')
    print(tls.recv(100).decode(), tls.version().startswith('TLS'))
thread.join(10)
db = sqlite3.connect('/workspace/t.db')
db.execute('create table t(x)')
db.executemany('insert into t values (?)', [(1,), (2,)])
db.commit()
print(db.execute('select sum(x) from t').fetchone()[0])
)PY";
    moat::exec_request request;
    request.argv = {"python3", "-c", script};
    const auto r = run(local->async_exec(box.id, request));
    REQUIRE(r);
    INFO(r->err.text());
    CHECK(r->exit_code == 0);
    CHECK(r->out.text() == "child\n6\nTLS WORKS True\n3\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "pip downloads from a local index, gcc and make build a program and git commits, "
                  "under the filter") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // A minimal wheel written by hand (a zip with its dist-info), served as a PEP 503 index by
    // http.server on the sandbox's loopback: no internet, no packages beyond the template's.
    const std::string make_index = R"PY(
import base64, hashlib, os, zipfile
os.makedirs('/workspace/index/simple/moatprobe', exist_ok=True)
name = 'moatprobe-1.0-py3-none-any.whl'
files = {'moatprobe/__init__.py': 'VALUE = 42\n',
         'moatprobe-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: moatprobe\nVersion: 1.0\n',
         'moatprobe-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n'}
record = ''
for path, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()
    record += f'{path},sha256={digest},{len(text)}\n'
record += 'moatprobe-1.0.dist-info/RECORD,,\n'
with zipfile.ZipFile('/workspace/index/' + name, 'w') as wheel:
    for path, text in files.items():
        wheel.writestr(path, text)
    wheel.writestr('moatprobe-1.0.dist-info/RECORD', record)
with open('/workspace/index/simple/moatprobe/index.html', 'w') as page:
    page.write(f'<a href="../../{name}">{name}</a>\n')
)PY";
    moat::exec_request index;
    index.argv = {"python3", "-c", make_index};
    const auto made = run(local->async_exec(box.id, index));
    REQUIRE(made);
    INFO(made->err.text());
    REQUIRE(made->exit_code == 0);
    const auto pip = sh(box.id,
                        "cd /workspace && (python3 -m http.server --bind 127.0.0.1 8765 "
                        "--directory /workspace/index >/dev/null 2>&1 &) && "
                        "for i in $(seq 50); do python3 -c \"import socket; "
                        "socket.create_connection(('127.0.0.1', 8765))\" 2>/dev/null && break; "
                        "sleep 0.1; done; "
                        "python3 -m pip download --no-deps --disable-pip-version-check "
                        "--index-url http://127.0.0.1:8765/simple -d /workspace/dl moatprobe "
                        ">/workspace/pip.log 2>&1; echo rc=$?; ls /workspace/dl; "
                        "tail -5 /workspace/pip.log");
    CHECK(pip.out.text().starts_with("rc=0\nmoatprobe-1.0-py3-none-any.whl\n"));
    const auto build = sh(box.id,
                          "cd /workspace && printf '#include <stdio.h>\\nint main(void) { "
                          "puts(\"built and ran\"); return 0; }\\n' > hello.c && "
                          "printf 'hello: hello.c\\n\\tgcc -O2 -o hello hello.c\\n' > Makefile && "
                          "make -s && ./hello");
    CHECK(build.out.text() == "built and ran\n");
    CHECK(build.exit_code == 0);
    const auto git = sh(box.id,
                        "cd /workspace && git init -q repo && cd repo && echo one > file && "
                        "git add file && git -c user.name=t -c user.email=t@example.com commit "
                        "-q -m first && git log --format=%s");
    CHECK(git.out.text() == "first\n");
    CHECK(git.exit_code == 0);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "the /proc entries containers mask are masked and /proc/sys is read-only") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // Of runc's masked files, those this kernel has (checked from the host): each is /dev/null
    // inside (character device 1:3), so reading it gives nothing.
    std::string files;
    for (const char* name : {"kcore", "keys", "key-users", "latency_stats", "timer_list",
                             "timer_stats", "sched_debug"}) {
        if (::access((std::string("/proc/") + name).c_str(), F_OK) == 0) {
            files += std::string(" /proc/") + name;
        }
    }
    REQUIRE_FALSE(files.empty());
    const auto masked =
        sh(box.id, "for f in" + files + "; do stat -c '%n %t:%T' $f; wc -c < $f; done 2>&1");
    std::string expected;
    std::istringstream names(files);
    std::string name;
    while (names >> name) expected += name + " 1:3\n0\n";
    CHECK(masked.out.text() == expected);
    // Masked directories are empty; read-only ones and /proc/sys refuse writes at the mount, not
    // only by file permissions.
    const auto read_only =
        sh(box.id,
           "python3 -c \"import os\n"
           "for p in ['/proc/sys', '/proc/sys/net', '/proc/bus', '/proc/fs', '/proc/irq',"
           " '/proc/acpi']:\n"
           "    if os.path.exists(p): print(p, os.statvfs(p).f_flag & os.ST_RDONLY != 0)\n"
           "print(os.listdir('/proc/acpi') if os.path.exists('/proc/acpi') else [])\n"
           "print(os.statvfs('/proc/self').f_flag & os.ST_RDONLY != 0)\"");
    const std::string out = read_only.out.text();
    INFO(out);
    CHECK(out.find("/proc/sys True\n") != std::string::npos);
    CHECK(out.find("/proc/sys/net True\n") != std::string::npos);
    CHECK(out.find("False\n") == out.rfind("False\n"));  // only /proc itself stays writable
    CHECK(out.ends_with("[]\nFalse\n"));
    // mountinfo names mount points as the sandbox sees them and, for the template's binds, the
    // same path in the source filesystem: never the helper's state directory or template path.
    // (moat's own mount points inside, /opt/moat/..., are the sandbox's paths and may show.)
    const auto mounts = sh(box.id, "cat /proc/self/mountinfo");
    CHECK(mounts.out.text().find(" /usr /usr ") != std::string::npos);
    std::string host_paths = mounts.out.text();
    for (std::size_t at = 0; (at = host_paths.find("/opt/moat", at)) != std::string::npos;)
        host_paths.erase(at, 9);
    CHECK(host_paths.find("moat") == std::string::npos);
    CHECK(host_paths.find("template") == std::string::npos);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "pid 1 leads its own session without a terminal and the host's /dev/tty is "
                  "absent") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // Fields 6 and 7 of /proc/1/stat: the session (1: pid 1 leads it; 0 would be a session
    // outside the sandbox's pid namespace, the embedding application's) and the controlling tty.
    const auto stat = sh(box.id, "cut -d' ' -f6,7 /proc/1/stat");
    CHECK(stat.out.text() == "1 0\n");
    CHECK(sh(box.id, "test -e /dev/tty && echo present || echo absent").out.text() == "absent\n");
    destroy(box.id);
}

namespace {

// The usage count /proc/keys shows for the key `serial` (this process possesses it), or -1.
long key_usage(long serial) {
    std::istringstream lines(moat::test::read_file("/proc/keys"));
    std::string line;
    char id[16];
    std::snprintf(id, sizeof id, "%08lx", serial);
    while (std::getline(lines, line)) {
        std::istringstream fields(line);
        std::string key, flags;
        long usage = -1;
        if (fields >> key >> flags >> usage && key == id) return usage;
    }
    return -1;
}

}  // namespace

TEST_CASE("a sandbox's processes hold no keyring of the embedding process") {
    MOAT_REQUIRE_NAMESPACES();
    // A session keyring of this test's own, holding a key, before the backend (and its helper)
    // exist, so that the helper inherits it as it would an application's login keyring.
    const long ring = ::syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "moat-boundary-test-ring");
    REQUIRE(ring > 0);
    const char secret[] = "host secret";
    REQUIRE(::syscall(SYS_add_key, "user", "moat-boundary-secret", secret, sizeof secret - 1,
                      KEY_SPEC_SESSION_KEYRING) > 0);
    local_fixture f;
    const auto box = f.create();
    // Each process that still had the ring as its session keyring holds a reference to it. Eight
    // sleeps inside would add at least eight.
    const long before = key_usage(ring);
    REQUIRE(before > 0);
    moat::exec_request holding =
        moat::test::shell("for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; echo started; wait");
    auto stream = f.run(f.local->async_exec_stream(box.id, holding));
    REQUIRE(stream);
    auto first = f.run(stream->async_next());
    REQUIRE(first);
    const auto* chunk = std::get_if<moat::output_chunk>(&*first);
    REQUIRE(chunk != nullptr);
    CHECK(chunk->data == "started\n");
    const long during = key_usage(ring);
    INFO("usage before " << before << ", with nine processes inside " << during);
    CHECK(during - before < 8);
    f.destroy(box.id);
}
