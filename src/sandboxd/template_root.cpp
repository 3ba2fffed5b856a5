#include "sandboxd/template_root.hpp"

#include "wire/protocol.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

namespace moat::sandboxd {
namespace {

constexpr std::string_view hosts_text =
    "127.0.0.1 localhost sandbox\n"
    "::1 localhost\n";
constexpr std::string_view nsswitch_text =
    "passwd: files\n"
    "group: files\n"
    "shadow: files\n"
    "hosts: files\n"
    "networks: files\n"
    "protocols: files\n"
    "services: files\n";

constexpr unsigned long read_only_bind = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV;

class builder {
  public:
    builder(const std::string& root, std::string& detail) : root_(root), detail_(detail) {}

    int fail(std::string_view step, const std::string& path) {
        const int err = errno != 0 ? errno : EIO;
        detail_ = "template root: " + std::string(step) + " " + path + ": " +
                  (::strerrorname_np(err) != nullptr ? ::strerrorname_np(err) : "E?");
        return err;
    }

    std::string at(std::string_view relative) const { return root_ + "/" + std::string(relative); }

    int make_dir(std::string_view relative, mode_t mode = 0755) {
        const std::string path = at(relative);
        if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return fail("mkdir", path);
        return 0;
    }

    int write_text(std::string_view relative, std::string_view text) {
        const std::string path = at(relative);
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) return fail("create", path);
        const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        const int err = ok ? 0 : fail("write", path);
        ::close(fd);
        return err;
    }

    int make_symlink(std::string_view relative, const char* target) {
        const std::string path = at(relative);
        if (::symlink(target, path.c_str()) != 0) return fail("symlink", path);
        return 0;
    }

    // A copy of the file `source` at `relative`, mode 0755.
    int copy_file(const char* source, std::string_view relative) {
        const std::string path = at(relative);
        const int in = ::open(source, O_RDONLY | O_CLOEXEC);
        if (in < 0) return fail("open", source);
        const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
        if (out < 0) {
            const int err = fail("create", path);
            ::close(in);
            return err;
        }
        char buffer[64 * 1024];
        int err = 0;
        for (;;) {
            const ssize_t n = ::read(in, buffer, sizeof buffer);
            if (n == 0) break;
            if (n < 0 || ::write(out, buffer, static_cast<std::size_t>(n)) != n) {
                err = fail("copy to", path);
                break;
            }
        }
        ::close(in);
        ::close(out);
        return err;
    }

    // Bind the file `source` read-only (nosuid, nodev) over the existing file `relative`.
    int bind_file(const std::string& source, std::string_view relative) {
        const std::string path = at(relative);
        if (::mount(source.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
            return fail("bind", path);
        }
        if (::mount(nullptr, path.c_str(), nullptr, read_only_bind, nullptr) != 0) {
            return fail("remount ro", path);
        }
        return 0;
    }

    // Bind `host` read-only at the same place in the template; a missing host path is skipped.
    // A symlink is reproduced instead (its target resolves inside the sandbox's own view), so
    // e.g. /etc/os-release -> ../usr/lib/os-release needs no mount.
    int mirror(const char* host, unsigned long extra_flags = MS_NODEV) {
        struct stat st {};
        if (::lstat(host, &st) != 0) return 0;
        const std::string path = at(host + 1);
        if (S_ISLNK(st.st_mode)) {
            char target[4096];
            const ssize_t n = ::readlink(host, target, sizeof target - 1);
            if (n < 0) return fail("readlink", host);
            target[n] = '\0';
            return make_symlink(host + 1, target);
        }
        if (S_ISDIR(st.st_mode)) {
            if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return fail("mkdir", path);
        } else {
            const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0) return fail("create", path);
            ::close(fd);
        }
        if (::mount(host, path.c_str(), nullptr, MS_BIND, nullptr) != 0) return fail("bind", path);
        const unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | extra_flags;
        if (::mount(nullptr, path.c_str(), nullptr, flags, nullptr) != 0) {
            return fail("remount ro", path);
        }
        bound_.emplace_back(host + 1);
        return 0;
    }

    // What mirror() bound so far, relative to the root, in order.
    const std::vector<std::string>& bound() const { return bound_; }

  private:
    const std::string& root_;
    std::string& detail_;
    std::vector<std::string> bound_;
};

int build_etc(builder& b) {
    const std::string passwd_text = passwd_for(template_user_name, "/workspace");
    const std::string group_text = group_for(template_user_name);
    if (const int err = b.make_dir("etc")) return err;
    struct text_file {
        const char* name;
        std::string_view text;
    };
    const text_file files[] = {
        {"etc/passwd", passwd_text}, {"etc/group", group_text},
        {"etc/hosts", hosts_text},   {"etc/hostname", "sandbox\n"},
        {"etc/resolv.conf", ""},     {"etc/nsswitch.conf", nsswitch_text},
    };
    for (const auto& f : files) {
        if (const int err = b.write_text(f.name, f.text)) return err;
    }
    for (const char* host : {"/etc/ld.so.cache", "/etc/localtime", "/etc/os-release",
                             "/etc/alternatives", "/etc/ssl"}) {
        if (const int err = b.mirror(host)) return err;
    }
    DIR* etc = ::opendir("/etc");
    if (etc == nullptr) return 0;
    int err = 0;
    while (const dirent* entry = ::readdir(etc)) {
        if (std::string_view(entry->d_name).starts_with("python3")) {
            const std::string host = std::string("/etc/") + entry->d_name;
            if ((err = b.mirror(host.c_str())) != 0) break;
        }
    }
    ::closedir(etc);
    return err;
}

int build_dev(builder& b) {
    const std::string dev = b.at("dev");
    if (const int err = b.make_dir("dev")) return err;
    const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (::mount("tmpfs", dev.c_str(), "tmpfs", flags, "mode=0755,size=64k") != 0) {
        return b.fail("mount tmpfs", dev);
    }
    // No /dev/tty: commands have no controlling terminal (except those started on a terminal of
    // the sandbox's own, which reach it through their descriptors), and the host's would be its
    // own.
    for (const char* node :
         {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}) {
        // Device nodes stay writable through a read-only mount; their own mounts must not be nodev.
        if (const int err = b.mirror(node, MS_NOEXEC)) return err;
    }
    const struct {
        const char* name;
        const char* target;
    } links[] = {{"dev/fd", "/proc/self/fd"},
                 {"dev/stdin", "/proc/self/fd/0"},
                 {"dev/stdout", "/proc/self/fd/1"},
                 {"dev/stderr", "/proc/self/fd/2"}};
    for (const auto& link : links) {
        if (const int err = b.make_symlink(link.name, link.target)) return err;
    }
    if (const int err = b.make_dir("dev/shm", 01777)) return err;
    // The mount point of each sandbox's own devpts instance (sandbox_child.cpp), and the
    // multiplexer every terminal is opened through, which names that instance's.
    if (const int err = b.make_dir("dev/pts")) return err;
    if (const int err = b.make_symlink("dev/ptmx", "pts/ptmx")) return err;
    if (::mount(nullptr, dev.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | flags, nullptr) != 0) {
        return b.fail("remount ro", dev);
    }
    return 0;
}

// `python` and `pip` for code that calls them by those names (model-written code, E2B's own
// tests) on a host that has only python3 (Debian without python-is-python3): symlinks in
// wire::command_alias_dir, which the default PATH names last (local_backend_exec.cpp), so a host's
// own python or pip wins wherever it is.
int build_command_aliases(builder& b) {
    const std::string_view dir = wire::command_alias_dir.substr(1);
    // Each level of the directory, "opt" first.
    for (auto slash = dir.find('/');; slash = dir.find('/', slash + 1)) {
        if (const int err = b.make_dir(dir.substr(0, slash))) return err;
        if (slash == std::string_view::npos) break;
    }
    // The mount point of each sandbox's own Python environment (python_env.hpp).
    if (const int err = b.make_dir(wire::python_env_dir.substr(1))) return err;
    const struct {
        const char* name;
        const char* target;
    } aliases[] = {{"python", "/usr/bin/python3"}, {"pip", "/usr/bin/pip3"}};
    for (const auto& alias : aliases) {
        struct stat st {};
        const std::string host_name = std::string("/usr/bin/") + alias.name;
        if (::lstat(host_name.c_str(), &st) == 0 || ::access(alias.target, X_OK) != 0) continue;
        const std::string link = std::string(dir) + "/" + alias.name;
        if (const int err = b.make_symlink(link, alias.target)) return err;
    }
    // The sudo shim: a copy of this very binary (static, so it needs nothing else from the
    // sandbox; a memfd, which the helper runs from, cannot be bind-mounted), which acts as the
    // shim when run as `sudo` (sudo_shim.hpp). Bound over a host's own sudo too, which could not
    // work in a sandbox (nosuid, no_new_privs) and would come first on PATH.
    const std::string shim = std::string(dir) + "/sudo";
    if (const int err = b.copy_file("/proc/self/exe", shim)) return err;
    for (const char* host : {"/usr/local/bin/sudo", "/usr/bin/sudo", "/usr/sbin/sudo"}) {
        struct stat st {};
        if (::stat(host, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (const int err = b.bind_file(b.at(shim), host + 1)) return err;
    }
    return 0;
}

}  // namespace

std::string passwd_for(std::string_view user, std::string_view home) {
    std::string text = "root:x:0:0:root:/root:/bin/sh\n";
    text.append(user).append(":x:1000:1000:").append(user).append(":").append(home);
    text += ":/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    return text;
}

std::string group_for(std::string_view user) {
    std::string text = "root:x:0:\n";
    text.append(user).append(":x:1000:\nnogroup:x:65534:\n");
    return text;
}

int build_template_root(const std::string& path, std::vector<std::string>& bound,
                        std::string& detail) {
    builder b(path, detail);
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return b.fail("mkdir", path);
    // Room for moat's own files and the sudo shim, a copy of this binary (some 2.5 MB).
    if (::mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=8m") != 0) {
        return b.fail("mount tmpfs", path);
    }
    if (const int err = b.mirror("/usr")) return err;
    for (const char* host : {"/bin", "/sbin", "/lib", "/lib64"}) {
        if (const int err = b.mirror(host)) return err;
    }
    // ".layer": where a sandbox of a template (create.template_layer) mounts its overlay.
    for (const char* dir : {"proc", "tmp", "workspace", "root", "home", ".layer"}) {
        if (const int err = b.make_dir(dir)) return err;
    }
    if (const int err = build_etc(b)) return err;
    if (const int err = build_command_aliases(b)) return err;
    bound = b.bound();  // /dev's own binds go with /dev, which a sandbox binds whole
    if (const int err = build_dev(b)) return err;
    // Superblock read-only first, then the mount itself, so copies made in a sandbox's user
    // namespace inherit a locked read-only flag.
    if (::mount(nullptr, path.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
                nullptr) != 0) {
        return b.fail("remount ro", path);
    }
    if (::mount(nullptr, path.c_str(), nullptr, read_only_bind, nullptr) != 0) {
        return b.fail("remount ro bind", path);
    }
    return 0;
}

}  // namespace moat::sandboxd
