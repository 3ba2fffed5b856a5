// Limits that cannot vanish and host-wide tables no sandbox can take: explicit-or-default
// resource limits (no explicit 0 meaning "unlimited"), the descriptor limit every sandbox process
// sees, TCP socket buffers charged to the sandbox, and uid ranges allocated host-wide outside
// every range the host or systemd uses. Checked from the host (/proc, cgroup files, flock) and
// from inside, never by timing.
#include "sandboxd/uid_slots.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"
#include "support/moat_cli.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

// The "Max open files" soft and hard values of /proc/<pid>/limits (or /proc/self inside).
std::pair<std::uint64_t, std::uint64_t> open_file_limits(const std::string& limits_text) {
    std::istringstream in(limits_text);
    std::string line;
    while (std::getline(in, line)) {
        if (!line.starts_with("Max open files")) continue;
        std::istringstream fields(line.substr(std::string("Max open files").size()));
        std::uint64_t soft = 0;
        std::uint64_t hard = 0;
        fields >> soft >> hard;
        return {soft, hard};
    }
    return {0, 0};
}

std::uint64_t read_number(const std::string& path) {
    std::ifstream in(path);
    std::uint64_t value = 0;
    in >> value;
    return value;
}

struct host_range {
    std::uint64_t first;
    std::uint64_t last;  // inclusive
    const char* what;
};

// Ranges a sandbox's host ids must never touch: systemd's (docs/UIDS-GIDS.md: homed and
// nspawn's bind-user range, dynamic users, the container range, the foreign-image range, and
// 2^31 and above), and every /etc/subuid and /etc/subgid entry of this host.
std::vector<host_range> forbidden_ranges() {
    std::vector<host_range> out = {
        {0, 60000, "system and regular users"},
        {60001, 60577, "systemd-homed and nspawn --bind-user"},
        {61184, 65519, "systemd dynamic users"},
        {65534, 65535, "nobody and 16-bit -1"},
        {524288, 1879048191, "systemd container range"},
        {2147352576, 2147418111, "systemd foreign uid range"},
        {2147483648, 4294967295, "2^31 and above"},
    };
    for (const char* file : {"/etc/subuid", "/etc/subgid"}) {
        std::ifstream in(file);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        for (const auto& r : moat::sandboxd::parse_subid_ranges(text)) {
            out.push_back({r.first, r.first + r.count - 1, file});
        }
    }
    return out;
}

// The host id that sandbox id 0 maps to, from /proc/<pid>/uid_map or gid_map ("0 base count").
std::uint64_t mapped_base(pid_t pid, const char* map, std::uint64_t& count) {
    std::istringstream in(moat::test::read_file("/proc/" + std::to_string(pid) + "/" + map));
    std::uint64_t inside = 1;
    std::uint64_t base = 0;
    count = 0;
    in >> inside >> base >> count;
    REQUIRE(inside == 0);
    return base;
}

// A directory of its own under /tmp, removed at the end of the test.
struct scratch_dir {
    std::string path;
    scratch_dir() {
        char name[] = "/tmp/moat-limits-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        path = name;
    }
    ~scratch_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

void check_refused(moat::test::local_fixture& f, moat::sandbox_spec spec, const char* field) {
    auto made = f.run(f.local->async_create(std::move(spec)));
    REQUIRE_FALSE(made);
    CHECK(made.error().code == moat::errc::invalid_argument);
    CHECK_MESSAGE(made.error().detail.find(std::string("limits.") + field) != std::string::npos,
                  made.error().detail);
}

}  // namespace

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "an explicit 0 for a limit where 0 would mean unlimited is refused, naming it") {
    MOAT_REQUIRE_NAMESPACES();
    // Each field set to 0 on its own, everything else left to the defaults.
    const auto refused_alone = [this](auto set_zero, const char* field) {
        moat::sandbox_spec spec;
        set_zero(spec.limits);
        check_refused(*this, spec, field);
    };
    refused_alone([](moat::resource_limits& l) { l.memory_bytes = 0; }, "memory_bytes");
    refused_alone([](moat::resource_limits& l) { l.pids = 0; }, "pids");
    refused_alone([](moat::resource_limits& l) { l.cpu_millicores = 0; }, "cpu_millicores");
    refused_alone([](moat::resource_limits& l) { l.workspace_bytes = 0; }, "workspace_bytes");
    refused_alone([](moat::resource_limits& l) { l.tmp_bytes = 0; }, "tmp_bytes");
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "unset limits are the defaults and the sandbox reports every effective limit") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = 64ull << 20;
    const auto box = create(spec);
    const auto& l = box.limits;
    CHECK(l.memory_bytes == 64ull << 20);
    CHECK(l.pids == moat::resource_limits::default_pids);
    CHECK(l.cpu_millicores == moat::resource_limits::default_cpu_millicores);
    CHECK(l.workspace_bytes == 32ull << 20);  // the default, clamped to half the memory limit
    CHECK(l.tmp_bytes == moat::resource_limits::default_tmp_bytes);
    CHECK(l.open_files == moat::resource_limits::default_open_files);
    auto inspected = run(local->async_inspect(box.id));
    REQUIRE(inspected);
    CHECK(inspected->limits.pids == moat::resource_limits::default_pids);
    CHECK(inspected->limits.open_files == moat::resource_limits::default_open_files);
    // The tmpfs sizes are the effective ones, none of them "unlimited".
    const auto mounts = sh(box.id, "grep -E ' /(workspace|tmp|dev/shm) ' /proc/self/mounts");
    CHECK(mounts.out.text().find("size=32768k") != std::string::npos);
    CHECK(mounts.out.text().find("size=65536k") != std::string::npos);
    destroy(box.id);
    moat::sandbox_spec too_few;
    too_few.limits.open_files = 8;
    check_refused(*this, too_few, "open_files");
}

TEST_CASE_FIXTURE(
    moat::test::local_fixture,
    "every sandbox process has the sandbox's descriptor limit, not the application's") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    // pid 1, seen from the host.
    const auto [init_soft, init_hard] =
        open_file_limits(moat::test::read_file("/proc/" + std::to_string(init) + "/limits"));
    CHECK(init_soft == 1024);
    CHECK(init_hard == 1024);
    // A command, seen from inside; raising the soft limit past the hard one, or the hard one at
    // all, fails.
    const auto inside =
        sh(box.id,
           "grep 'Max open files' /proc/self/limits; ulimit -Hn; "
           "(ulimit -Sn 1025) 2>/dev/null && echo soft-raised || echo soft-refused; "
           "(ulimit -Hn 1025) 2>/dev/null && echo hard-raised || echo hard-refused");
    const auto [soft, hard] = open_file_limits(inside.out.text());
    CHECK(soft == 1024);
    CHECK(hard == 1024);
    CHECK(inside.out.text().find("\n1024\n") != std::string::npos);
    CHECK(inside.out.text().find("soft-refused") != std::string::npos);
    CHECK(inside.out.text().find("hard-refused") != std::string::npos);
    // The worst case this allows, from what the host enforces: every process the pids cgroup
    // lets the sandbox have, each holding its hard limit of files, stays below fs.file-max.
    const std::uint64_t pids_max = read_number(moat::test::cgroup_dir(init, "pids") + "/pids.max");
    const std::uint64_t file_max = read_number("/proc/sys/fs/file-max");
    REQUIRE(pids_max > 0);
    REQUIRE(file_max > 0);
    CHECK_MESSAGE(pids_max * hard < file_max,
                  pids_max << " processes x " << hard << " files vs fs.file-max " << file_max);
    destroy(box.id);

    moat::sandbox_spec few;
    few.limits.open_files = 100;
    const auto small = create(few);
    const auto seen = sh(small.id, "ulimit -Hn; ulimit -Sn");
    CHECK(seen.out.text() == "100\n100\n");
    destroy(small.id);
}

TEST_CASE("moat doctor compares fs.file-max with the worst case of the default limits") {
    const auto o = moat::test::moat_cli("doctor");
    const std::uint64_t per_sandbox = std::uint64_t{moat::resource_limits::default_pids} *
                                      moat::resource_limits::default_open_files;
    CHECK_MESSAGE(o.output.find("file table") != std::string::npos, o.output);
    CHECK_MESSAGE(
        o.output.find("= " + std::to_string(per_sandbox) + " files of fs.file-max " +
                      std::to_string(read_number("/proc/sys/fs/file-max"))) != std::string::npos,
        o.output);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "loopback TCP buffers of a 64 MiB sandbox stay within its memory limit" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    constexpr std::uint64_t memory = 64ull << 20;
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = memory;
    const auto box = create(spec);
    // Eight processes, each a server that accepts and never reads and clients that write
    // without blocking until the kernel refuses more, up to 480 connections each (the kernel lets
    // every socket past a full charge for one packet, so many connections is the hard case).
    // Each stops once its share of twice the memory limit is queued, so the host is never pushed
    // further. Queued bytes: the senders' SIOCOUTQ plus the receivers' SIOCINQ.
    moat::exec_request flood;
    flood.argv = {"python3", "-c",
                  R"(
import fcntl, os, socket, struct, termios
SIOCOUTQ = 0x5411
workers, per_worker = 8, 480
share = 2 * )" + std::to_string(memory) +
                      R"( // workers
def flood():
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(512)
    port = server.getsockname()[1]
    senders, receivers = [], []
    chunk = b'x' * (1 << 20)
    def queued():
        q = 0
        for s in senders:
            q += struct.unpack('i', fcntl.ioctl(s, SIOCOUTQ, b'\0' * 4))[0]
        for s in receivers:
            q += struct.unpack('i', fcntl.ioctl(s, termios.FIONREAD, b'\0' * 4))[0]
        return q
    total = 0
    while len(senders) < per_worker and total < share:
        try:
            c = socket.create_connection(('127.0.0.1', port), timeout=5)
            a, _ = server.accept()
        except OSError:
            break
        c.setblocking(False)
        senders.append(c)
        receivers.append(a)
        while True:
            try:
                if c.send(chunk) == 0:
                    break
            except OSError:
                break
        total = queued()
    return total, len(senders)
r, w = os.pipe()
children = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b'%d %d\n' % flood())
        os._exit(0)
    children.append(pid)
os.close(w)
report = b''
while True:
    data = os.read(r, 4096)
    if not data:
        break
    report += data
for pid in children:
    os.waitpid(pid, 0)
lines = [l.split() for l in report.decode().splitlines()]
print(sum(int(q) for q, _ in lines), sum(int(n) for _, n in lines), len(lines))
)"};
    flood.wall_limit = 120s;
    const auto r = run(local->async_exec(box.id, flood));
    REQUIRE(r);
    INFO("output: " << r->out.text() << " stderr: " << r->err.text());
    REQUIRE(r->exit_code == 0);
    std::istringstream in(r->out.text());
    std::uint64_t queued = 0;
    int connections = 0;
    int reported = 0;
    in >> queued >> connections >> reported;
    MESSAGE("queued " << (queued >> 20) << " MiB in " << connections << " connections");
    REQUIRE(reported == 8);  // every worker reported (none was OOM-killed)
    CHECK(connections > 400);
    CHECK(queued < memory);
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a sandbox's uid and gid ranges overlap no subuid entry and no systemd range") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    for (const char* map : {"uid_map", "gid_map"}) {
        std::uint64_t count = 0;
        const std::uint64_t first = mapped_base(*box.host_pid, map, count);
        REQUIRE(count == 65536);
        const std::uint64_t last = first + count - 1;
        for (const auto& r : forbidden_ranges()) {
            CHECK_MESSAGE((last < r.first || first > r.last),
                          std::string(map)
                              << " " << first << "-" << last << " overlaps " << std::string(r.what)
                              << " " << r.first << "-" << r.last);
        }
    }
    destroy(box.id);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "two backends with different state directories never share a uid range") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    std::uint64_t count = 0;
    const std::uint64_t base = mapped_base(*box.host_pid, "uid_map", count);
    // Any moat on the host, whatever its state directory, finds the range taken: its lock is
    // held in the host-wide directory.
    const std::string lock =
        std::string(moat::sandboxd::host_lock_dir) + "/" + std::to_string(base) + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    REQUIRE_MESSAGE(fd >= 0, lock << " missing");
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
    CHECK(errno == EWOULDBLOCK);
    ::close(fd);

    // A second backend with a state directory of its own: its sandboxes get other ranges.
    scratch_dir dir;
    REQUIRE(::chmod(dir.path.c_str(), 0711) == 0);  // sandbox uids must reach the template
    moat::local_options options;
    options.state_dir = dir.path + "/state";
    auto other = moat::make_local_backend(io.get_executor(), options);
    std::vector<std::string> ids;
    for (int i = 0; i < 4; ++i) {
        auto made = run(other->async_create({}));
        REQUIRE_MESSAGE(made, made.error().to_string());
        std::uint64_t other_count = 0;
        CHECK(mapped_base(*made->host_pid, "uid_map", other_count) != base);
        ids.push_back(made->id);
    }
    for (const auto& id : ids) CHECK(run(other->async_destroy(id)));
    destroy(box.id);
}

TEST_CASE("uid slots are claimed host-wide and skip ranges reserved in subuid files") {
    scratch_dir dir;
    // Another helper's claim, through the host-wide directory: a second allocator, with a
    // reserved-ranges file of its own, never gets the same slot, nor a reserved one.
    moat::sandboxd::uid_slots first;
    REQUIRE(first.open() == 0);
    moat::sandboxd::uid_slot taken;
    REQUIRE(first.claim(taken) == 0);
    const std::uint32_t slot = (taken.uid_base - moat::sandboxd::first_uid) / 65536;
    const std::uint32_t next = (slot + 1) % moat::sandboxd::slot_count;
    const std::uint64_t next_base = moat::sandboxd::first_uid + std::uint64_t{next} * 65536;
    {
        std::ofstream subuid(dir.path + "/subuid");
        subuid << "# a comment\nalice:100000:65536\nbob:" << next_base + 100 << ":10\nbad line\n";
    }
    moat::sandboxd::uid_slot_options options;
    options.reserved_files = {dir.path + "/subuid", dir.path + "/missing"};
    moat::sandboxd::uid_slots second;
    REQUIRE(second.open(options) == 0);
    moat::sandboxd::uid_slot got;
    REQUIRE(second.claim_from(slot, got) == 0);
    CHECK(got.uid_base != taken.uid_base);
    CHECK(got.uid_base != next_base);
    CHECK(got.uid_base % 65536 == 0);
    ::close(got.lock_fd);
    ::close(taken.lock_fd);

    const auto ranges = moat::sandboxd::parse_subid_ranges("a:1:2\n#x:3:4\nb:5\nc:6:0\nd:7:8");
    REQUIRE(ranges.size() == 2);
    CHECK(ranges[0].first == 1);
    CHECK(ranges[0].count == 2);
    CHECK(ranges[1].first == 7);
    CHECK(ranges[1].count == 8);
}
