// moat-spike-idmap: the ownership spike of the layers work (docs/architecture.md, "Layers and
// ownership"). A user namespace mapped as a moat sandbox's (0 -> a private host range of 65536
// ids; host root unmapped) gets its /usr in two ways, timed from clone until the child has it:
//
//   bind      today's read-only bind of the host's /usr (what the template root does)
//   overlay   a read-only idmapped clone of the host's /usr (open_tree + mount_setattr
//             MOUNT_ATTR_IDMAP onto the child's user namespace, made by host root and passed in
//             by SCM_RIGHTS) as the lower of an overlay whose upper is a tmpfs in the child
//
// and, once per variant, checks what the sandbox's root and uid 1000 may do with it, and that the
// host's files are unchanged. Run as root: `moat-spike-idmap [N]` (N rounds per variant, 200).
// A dev tool: not part of the library, the CLI or the suite.
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/idmapped_mount.hpp"
#include "wire/fd_passing.hpp"

namespace {

// A host range no moat sandbox uses (uid_slots allocates below 0x7ffe0000).
constexpr unsigned spike_base = 0x7ff00000u;
// A root-owned file of every Debian host, appended to by the sandbox's root (copy-up).
constexpr const char* probe_file = "/usr/share/doc/bash/copyright";

using clock_type = std::chrono::steady_clock;

enum class variant { bind, overlay };

struct child_args {
    int sock = -1;
    variant kind = variant::bind;
    bool check = false;
};

const char* outcome(int rc) {
    return rc == 0 ? "allowed" : std::strerror(errno);
}

int move_detached(int tree, const char* target) {
    return static_cast<int>(
        ::syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH));
}

// What the sandbox's root and uid 1000 may do with the /usr it got.
void report_permissions() {
    struct stat st {};
    if (::stat("/mnt/usr/bin/ls", &st) == 0)
        std::printf("  /usr/bin/ls inside: uid %u gid %u\n", st.st_uid, st.st_gid);
    std::printf("  root: mkdir /usr/local/spike: %s\n",
                outcome(::mkdir("/mnt/usr/local/spike", 0755)));
    const std::string probe = std::string("/mnt") + probe_file;
    const int fd = ::open(probe.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    int appended = -1;
    if (fd >= 0) {
        appended = ::write(fd, "x\n", 2) == 2 ? 0 : -1;
        ::close(fd);
    }
    std::printf("  root: append to a root-owned file: %s\n", outcome(fd < 0 ? -1 : appended));
    std::printf("  root: chmod /usr/bin/ls: %s\n", outcome(::chmod("/mnt/usr/bin/ls", 0700)));
    if (::setresgid(1000, 1000, 1000) != 0 || ::setresuid(1000, 1000, 1000) != 0) return;
    std::printf("  uid 1000: mkdir /usr/x: %s\n", outcome(::mkdir("/mnt/usr/x", 0755)));
    const int mine = ::open("/mnt/usr/local/spike/mine", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    std::printf("  uid 1000: create in root's new directory: %s\n", outcome(mine < 0 ? -1 : 0));
    std::fflush(stdout);
}

int child_main(void* raw) {
    const auto& args = *static_cast<child_args*>(raw);
    char byte = 0;
    if (::read(args.sock, &byte, 1) != 1) return 10;  // the maps are written
    if (::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0) return 11;
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 12;
    if (::mount("tmpfs", "/mnt", "tmpfs", 0, "mode=0755,size=64m") != 0) return 13;
    ::mkdir("/mnt/usr", 0755);
    if (args.kind == variant::bind) {
        if (::mount("/usr", "/mnt/usr", nullptr, MS_BIND | MS_REC, nullptr) != 0) return 14;
        if (::mount(nullptr, "/mnt/usr", nullptr,
                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
            return 15;
    } else {
        int fds[1] = {-1};
        std::size_t count = 0;
        std::byte buffer[1];
        bool lost = false;
        if (moat::wire::receive_record(args.sock, buffer, fds, count, lost, 0) != 1 || count != 1)
            return 16;
        ::mkdir("/mnt/.lower", 0700);
        ::mkdir("/mnt/.upper", 0755);
        ::mkdir("/mnt/.work", 0700);
        if (move_detached(fds[0], "/mnt/.lower") != 0) return 17;
        ::close(fds[0]);
        if (::mount("overlay", "/mnt/usr", "overlay", MS_NOSUID | MS_NODEV,
                    "lowerdir=/mnt/.lower,upperdir=/mnt/.upper,workdir=/mnt/.work") != 0)
            return 18;
    }
    if (::write(args.sock, "r", 1) != 1) return 19;
    if (args.check) report_permissions();
    return 0;
}

// Writes "0 <base> 65536" as the child's maps, as the helper does for a sandbox.
bool write_maps(pid_t pid) {
    const std::string map = "0 " + std::to_string(spike_base) + " 65536\n";
    const std::string dir = "/proc/" + std::to_string(pid) + "/";
    const std::pair<const char*, std::string> files[] = {
        {"uid_map", map}, {"setgroups", "deny"}, {"gid_map", map}};
    for (const auto& [name, text] : files) {
        const int fd = ::open((dir + name).c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) return false;
        const bool whole =
            ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        ::close(fd);
        if (!whole) return false;
    }
    return true;
}

// Host root's part of the overlay variant: the idmapped clone of /usr, handed to the child.
bool send_idmapped_usr(pid_t pid, int sock) {
    const std::string ns_path = "/proc/" + std::to_string(pid) + "/ns/user";
    const int userns = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
    const char* step = "";
    const int tree =
        userns < 0
            ? -1
            : moat::idmapped::open_tree(
                  "/usr", userns, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, step);
    bool sent = tree >= 0;
    if (sent) {
        const std::byte marker{0};
        const int fds[1] = {tree};
        sent = moat::wire::send_record(sock, std::span(&marker, 1), fds, 0) == 1;
    }
    if (tree >= 0) ::close(tree);
    if (userns >= 0) ::close(userns);
    return sent;
}

// One round: clone until the child has its /usr. Milliseconds, or a negative on failure.
double round_ms(variant kind, bool check) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return -1;
    child_args args{pair[1], kind, check};
    static std::vector<char> stack(256 * 1024);
    const auto start = clock_type::now();
    const pid_t pid = ::clone(child_main, stack.data() + stack.size(),
                              CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD, &args);
    double took = -1;
    char ready = 0;
    if (pid > 0 && write_maps(pid) && ::write(pair[0], "m", 1) == 1 &&
        (kind == variant::bind || send_idmapped_usr(pid, pair[0])) &&
        ::read(pair[0], &ready, 1) == 1)
        took = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
    if (pid > 0) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        if (took >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) took = -1;
        if (took < 0 && WIFEXITED(status))
            std::fprintf(stderr, "child failed at step %d\n", WEXITSTATUS(status));
    }
    ::close(pair[0]);
    ::close(pair[1]);
    return took;
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
    struct stat before {};
    if (::stat(probe_file, &before) != 0) {
        std::fprintf(stderr, "%s: %s\n", probe_file, std::strerror(errno));
        return 1;
    }
    // Alternating rounds, so both variants meet the same load.
    std::vector<double> times[2];
    for (int i = 0; i < rounds; ++i) {
        for (const variant kind : {variant::bind, variant::overlay}) {
            const double ms = round_ms(kind, false);
            if (ms < 0) return 2;
            times[static_cast<int>(kind)].push_back(ms);
        }
    }
    const char* names[] = {"read-only bind of /usr", "overlay on an idmapped /usr"};
    for (const variant kind : {variant::bind, variant::overlay}) {
        auto& t = times[static_cast<int>(kind)];
        std::sort(t.begin(), t.end());
        std::printf("%s: n %d, p50 %.3f ms, p99 %.3f ms\n", names[static_cast<int>(kind)], rounds,
                    t[t.size() / 2], t[t.size() * 99 / 100]);
        std::fflush(stdout);
        if (round_ms(kind, true) < 0) return 3;
    }
    struct stat after {};
    ::stat(probe_file, &after);
    const bool unchanged = after.st_size == before.st_size && after.st_mode == before.st_mode;
    const bool no_dir = ::access("/usr/local/spike", F_OK) != 0;
    std::printf("host: %s %s, /usr/local/spike %s\n", probe_file,
                unchanged ? "unchanged" : "CHANGED", no_dir ? "absent" : "PRESENT");
    return unchanged && no_dir ? 0 : 4;
}
