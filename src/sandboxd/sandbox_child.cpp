// The sandbox's clone child (its contract with the parent is sandbox_child.hpp): from the release
// byte to execveat of the agent, every step of spawn_sandbox.hpp's list in order, each a raw
// system call whose failure is recorded as (step, errno) for the parent to report.
#include "sandboxd/sandbox_child.hpp"

#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/mount.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <csignal>
#include <cstddef>
#include <iterator>

#include "sandboxd/raw_syscall.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

enum class step : int {
    none,
    wait_release,
    cgroup_attach,
    cgroup_namespace,
    setgroups,
    setresgid,
    bind_template,
    chdir_template,
    setresuid,
    session_keyring,
    setsid,
    pdeathsig,
    owner_gone,
    layer_receive,
    layer_scratch,
    layer_attach,
    layer_overlay,
    layer_dev,
    layer_binds,
    layer_etc,
    layer_chdir,
    python_env,
    mount_proc,
    mount_tmp,
    mount_shm,
    mount_devpts,
    mount_workspace,
    layout_etc,
    mount_home,
    mount_root,
    layout_dirs,
    pivot_root,
    umount_old_root,
    chdir_root,
    mask_proc,
    sethostname,
    loopback,
    socket_buffers,
    proc_sys_read_only,
    rlimit_core,
    arrange_fds,
    open_dev_null,
    close_range,
    no_new_privs,
    seccomp,
    execveat,
};

constexpr const char* step_names[] = {
    "none",
    "waiting for release",
    "join cgroups",
    "unshare(CLONE_NEWCGROUP)",
    "setgroups",
    "setresgid",
    "bind template root",
    "chdir template root",
    "setresuid",
    "keyctl(KEYCTL_JOIN_SESSION_KEYRING)",
    "setsid",
    "PR_SET_PDEATHSIG",
    "helper exited during create",
    "receive the template layer",
    "mount the layer's upper tmpfs",
    "attach the template layer",
    "mount the overlay root",
    "bind /dev and /opt/moat into the overlay root",
    "bind the host's /usr and /etc files into the overlay root",
    "write /etc into the overlay root",
    "chdir overlay root",
    "write the Python environment /opt/moat/python",
    "mount /proc",
    "mount /tmp",
    "mount /dev/shm",
    "mount /dev/pts",
    "mount /workspace",
    "layout: bind /etc/passwd and /etc/group",
    "mount /home",
    "mount /root",
    "layout: make directories",
    "pivot_root",
    "umount old root",
    "chdir /",
    "mask /proc entries",
    "sethostname",
    "loopback up",
    "net.ipv4.tcp_rmem / tcp_wmem",
    "read-only /proc/sys",
    "RLIMIT_CORE",
    "arrange fds",
    "open /dev/null",
    "close_range",
    "PR_SET_NO_NEW_PRIVS",
    "seccomp",
    "execveat agent",
};
static_assert(std::size(step_names) == static_cast<std::size_t>(step::execveat) + 1);

[[noreturn]] void child_fail(child_args& args, step failed, long result) {
    __atomic_store_n(&args.failed_errno, static_cast<int>(-result), __ATOMIC_RELAXED);
    __atomic_store_n(&args.failed_step, static_cast<int>(failed), __ATOMIC_RELEASE);
    raw(SYS_exit_group, 1);
    __builtin_unreachable();
}

// Runs `number(args...)` and records `failed` if it returns a negative errno.
template <class... Args>
long checked(child_args& a, step failed, long number, Args... args) {
    const long result = raw(number, args...);
    if (result < 0) child_fail(a, failed, result);
    return result;
}

long mount_tmpfs(child_args& a, step failed, const char* target, const char* options) {
    return checked(a, failed, SYS_mount, "tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options);
}

// The sandbox's own terminals: a new devpts instance, mounted in its user namespace (and so owned
// by it), whose ptmx the template's /dev/ptmx names. Never the host's /dev/pts: its terminals
// are not listed here, let alone opened. A mount is possible only now (seccomp forbids one
// later); `max` bounds the terminals one sandbox can hold open.
void mount_devpts(child_args& a) {
    checked(a, step::mount_devpts, SYS_mount, "devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620,max=256");
}

// The layout's own /etc/passwd and /etc/group: written to a scratch tmpfs on the /tmp mount point
// (before /tmp's own tmpfs), each bound read-only over the template's file, then the scratch
// mount is detached (the binds keep it alive). No file of it is writable from inside.
void bind_layout_etc(child_args& a) {
    mount_tmpfs(a, step::layout_etc, "tmp", "size=64k,mode=0755");
    const struct {
        const char* scratch;
        const char* target;
        const char* text;
        std::size_t length;
    } files[] = {{"tmp/passwd", "etc/passwd", a.passwd_text, a.passwd_length},
                 {"tmp/group", "etc/group", a.group_text, a.group_length}};
    for (const auto& f : files) {
        const long fd = checked(a, step::layout_etc, SYS_openat, AT_FDCWD, f.scratch,
                                O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        const long written = checked(a, step::layout_etc, SYS_write, fd, f.text, f.length);
        raw(SYS_close, fd);
        if (static_cast<std::size_t>(written) != f.length) child_fail(a, step::layout_etc, -EIO);
        checked(a, step::layout_etc, SYS_mount, f.scratch, f.target, nullptr, MS_BIND, nullptr);
        checked(a, step::layout_etc, SYS_mount, nullptr, f.target, nullptr,
                MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    }
    checked(a, step::layout_etc, SYS_umount2, "tmp", MNT_DETACH);
}

// The layout's directories outside /workspace (home, workdir, artifacts_dir and their parents
// below /tmp or /home), owned by the sandbox user. Nothing in the sandbox has run yet, so
// nothing can have planted a link on the way.
void make_layout_dirs(child_args& a) {
    const char* path = a.layout_dirs;
    for (int i = 0; i < a.layout_dir_count; ++i) {
        const long made = raw(SYS_mkdirat, AT_FDCWD, path, 0755);
        if (made < 0 && made != -EEXIST) child_fail(a, step::layout_dirs, made);
        checked(a, step::layout_dirs, SYS_fchownat, AT_FDCWD, path, wire::sandbox_user_id,
                wire::sandbox_group_id, AT_SYMLINK_NOFOLLOW);
        while (*path != '\0') ++path;
        ++path;
    }
}

// The idmapped layer the parent sends on the layer socket (spawn_sandbox.cpp, send_layer).
long receive_layer(child_args& a) {
    char byte = 0;
    iovec data{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const long got =
        checked(a, step::layer_receive, SYS_recvmsg, a.layer_socket, &message, MSG_CMSG_CLOEXEC);
    const cmsghdr* header = CMSG_FIRSTHDR(&message);
    if (got != 1 || header == nullptr || header->cmsg_level != SOL_SOCKET ||
        header->cmsg_type != SCM_RIGHTS || header->cmsg_len != CMSG_LEN(sizeof(int)))
        child_fail(a, step::layer_receive, -EPROTO);
    int fd = -1;
    __builtin_memcpy(&fd, CMSG_DATA(header), sizeof fd);
    return fd;
}

// `to` (in the overlay root's /etc) replaced by a new file holding `length` bytes of `text`; a
// link or file the template had there is removed first (never followed).
void write_etc_file(child_args& a, const char* to, const char* text, std::size_t length) {
    const long removed = raw(SYS_unlinkat, AT_FDCWD, to, 0);
    if (removed < 0 && removed != -ENOENT) child_fail(a, step::layer_etc, removed);
    const long fd = checked(a, step::layer_etc, SYS_openat, AT_FDCWD, to,
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    checked(a, step::layer_etc, SYS_fchown, fd, 0, 0);
    const long written = checked(a, step::layer_etc, SYS_write, fd, text, length);
    raw(SYS_close, fd);
    if (static_cast<std::size_t>(written) != length) child_fail(a, step::layer_etc, -EIO);
}

// The template root's file `from` copied to `to` as write_etc_file writes.
void copy_etc_file(child_args& a, const char* from, const char* to) {
    char buffer[4096];
    const long in = checked(a, step::layer_etc, SYS_openat, AT_FDCWD, from, O_RDONLY | O_CLOEXEC);
    const long length = checked(a, step::layer_etc, SYS_read, in, buffer, sizeof buffer);
    raw(SYS_close, in);
    write_etc_file(a, to, buffer, static_cast<std::size_t>(length));
}

// moat's own commands (/opt/moat/bin: the sudo shim, the python alias) bound from the template
// root into a template sandbox's, where the layer's /opt is a real directory (never through a
// link the layer holds; nothing of the sandbox runs yet). A root whose /opt is a link or a file
// goes without them (false).
bool bind_moat_commands(child_args& a) {
    for (const char* dir : {".layer/root/opt", ".layer/root/opt/moat"}) {
        const long made = raw(SYS_mkdirat, AT_FDCWD, dir, 0755);
        if (made == 0) {
            checked(a, step::layer_dev, SYS_fchownat, AT_FDCWD, dir, 0, 0, AT_SYMLINK_NOFOLLOW);
        } else if (made != -EEXIST) {
            return false;
        }
        const long fd =
            raw(SYS_openat, AT_FDCWD, dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return false;
        raw(SYS_close, fd);
    }
    checked(a, step::layer_dev, SYS_mount, "opt/moat", ".layer/root/opt/moat", nullptr,
            MS_BIND | MS_REC, nullptr);
    return true;
}

// The template root's host binds (/usr, /etc/ssl...) bound again over the overlay of it, which
// shows only the template root's own files (its mount points).
void bind_base_mounts(child_args& a) {
    const char* path = a.base_binds;
    for (int i = 0; i < a.base_bind_count; ++i) {
        char target[256] = ".layer/root/";
        std::size_t t = 12;
        const char* c = path;
        while (*c != '\0' && t < sizeof target - 1) target[t++] = *c++;
        if (*c != '\0') child_fail(a, step::layer_binds, -ENAMETOOLONG);
        target[t] = '\0';
        checked(a, step::layer_binds, SYS_mount, path, target, nullptr, MS_BIND | MS_REC, nullptr);
        path = c + 1;
    }
}

// A sandbox's writable root (cwd: the template root, whose /dev and /etc it borrows): a tmpfs on
// .layer holds the upper and the overlay's work directory; the idmapped layer the parent sent (a
// template's, or the template root itself) is attached as the lower; the overlay is mounted on
// .layer/root with the template root's /dev bound in. Over a template's layer moat's /etc files
// are written (in the upper) and /opt/moat bound in; over the template root, which has both, its
// host binds are bound again. The cwd moves into it, and the mount steps that follow build on it
// as they do on the template root. Returns whether the root has /opt/moat (a template layer's
// only where bind_moat_commands could bind it).
bool build_layer_root(child_args& a) {
    const long layer = receive_layer(a);
    raw(SYS_close, a.layer_socket);
    checked(a, step::layer_scratch, SYS_mount, "tmpfs", ".layer", "tmpfs", MS_NOSUID | MS_NODEV,
            a.layer_options);
    // Owned by the sandbox's root and group 0 (pid 1's group is already the user's): the
    // upper's root is the sandbox's "/".
    for (const char* dir : {".layer/lower", ".layer/upper", ".layer/work", ".layer/root"}) {
        checked(a, step::layer_scratch, SYS_mkdirat, AT_FDCWD, dir, 0755);
        checked(a, step::layer_scratch, SYS_fchownat, AT_FDCWD, dir, 0, 0, AT_SYMLINK_NOFOLLOW);
    }
    checked(a, step::layer_attach, SYS_move_mount, layer, "", AT_FDCWD, ".layer/lower",
            MOVE_MOUNT_F_EMPTY_PATH);
    raw(SYS_close, layer);
    checked(a, step::layer_overlay, SYS_mount, "overlay", ".layer/root", "overlay",
            MS_NOSUID | MS_NODEV,
            "lowerdir=.layer/lower,upperdir=.layer/upper,workdir=.layer/work");
    checked(a, step::layer_dev, SYS_mount, "dev", ".layer/root/dev", nullptr, MS_BIND | MS_REC,
            nullptr);
    if (a.layer_is_base) {
        bind_base_mounts(a);
        if (a.has_layout_etc) {
            write_etc_file(a, ".layer/root/etc/passwd", a.passwd_text, a.passwd_length);
            write_etc_file(a, ".layer/root/etc/group", a.group_text, a.group_length);
        }
        checked(a, step::layer_chdir, SYS_chdir, ".layer/root");
        return true;
    }
    const bool moat_commands = bind_moat_commands(a);
    for (const char* file : {"hosts", "hostname", "resolv.conf", "nsswitch.conf"}) {
        char from[32] = "etc/";
        char to[48] = ".layer/root/etc/";
        std::size_t f = 4;
        std::size_t t = 16;
        for (const char* c = file; *c != '\0'; ++c) from[f++] = to[t++] = *c;
        copy_etc_file(a, from, to);
    }
    if (a.has_layout_etc) {
        write_etc_file(a, ".layer/root/etc/passwd", a.passwd_text, a.passwd_length);
        write_etc_file(a, ".layer/root/etc/group", a.group_text, a.group_length);
    } else {
        copy_etc_file(a, "etc/passwd", ".layer/root/etc/passwd");
        copy_etc_file(a, "etc/group", ".layer/root/etc/group");
    }
    checked(a, step::layer_chdir, SYS_chdir, ".layer/root");
    return moat_commands;
}

// `path` below the environment's directory `dir`, made the sandbox user's.
void own_python_path(child_args& a, long dir, const char* path) {
    checked(a, step::python_env, SYS_fchownat, dir, path, wire::sandbox_user_id,
            wire::sandbox_group_id, AT_SYMLINK_NOFOLLOW);
}

void write_python_file(child_args& a, long dir, const char* path, const char* text,
                       std::size_t length, int mode) {
    const long fd = checked(a, step::python_env, SYS_openat, dir, path,
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    checked(a, step::python_env, SYS_fchown, fd, wire::sandbox_user_id, wire::sandbox_group_id);
    const long written = checked(a, step::python_env, SYS_write, fd, text, length);
    raw(SYS_close, fd);
    if (static_cast<std::size_t>(written) != length) child_fail(a, step::python_env, -EIO);
}

// The sandbox's Python environment (python_env.hpp): a tmpfs of its own on the root's
// opt/moat/python (the template root's mount point, bound into a template sandbox's root with
// /opt/moat), the skeleton written into it, all of it the sandbox user's. Each entry is chowned:
// a change of the file system uid would clear the parent-death signal set above.
void write_python_env(child_args& a) {
    const python_env_files& p = *a.python;
    checked(a, step::python_env, SYS_mount, "tmpfs", "opt/moat/python", "tmpfs",
            MS_NOSUID | MS_NODEV, a.workspace_options);
    const long dir = checked(a, step::python_env, SYS_openat, AT_FDCWD, "opt/moat/python",
                             O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    for (const char* sub : {"bin", "lib", p.lib_dir, p.site_dir}) {
        checked(a, step::python_env, SYS_mkdirat, dir, sub, 0755);
        own_python_path(a, dir, sub);
    }
    const struct {
        const char* target;
        const char* link;
    } links[] = {{p.interpreter, "bin/python3"},  {"python3", "bin/python"},
                 {"python3", p.versioned_python}, {"pip", "bin/pip3"},
                 {"pip", p.versioned_pip},        {"lib", "lib64"}};
    for (const auto& l : links) {
        checked(a, step::python_env, SYS_symlinkat, l.target, dir, l.link);
        own_python_path(a, dir, l.link);
    }
    write_python_file(a, dir, "pyvenv.cfg", p.pyvenv_cfg, p.pyvenv_cfg_length, 0644);
    write_python_file(a, dir, "pip.conf", p.pip_conf, p.pip_conf_length, 0644);
    write_python_file(a, dir, "bin/pip", p.pip_script, p.pip_script_length, 0755);
    raw(SYS_close, dir);
}

void bring_up_loopback(child_args& a) {
    const long fd = checked(a, step::loopback, SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq request{};
    request.ifr_name[0] = 'l';
    request.ifr_name[1] = 'o';
    checked(a, step::loopback, SYS_ioctl, fd, SIOCGIFFLAGS, &request);
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP | IFF_RUNNING);
    checked(a, step::loopback, SYS_ioctl, fd, SIOCSIFFLAGS, &request);
    raw(SYS_close, fd);
}

// The sandbox's own network namespace gets small TCP buffers (the sysctls are per namespace; the
// pool, net.ipv4.tcp_mem, is the host's). The memory cgroup charges socket buffers, but the kernel
// lets every socket past a full charge for one packet on each side; with the host defaults
// (initial buffers 128 KiB to receive, sender autotuning to 4 MiB) that floor was ~64 KiB per
// connection: ~4x the memory limit of a sandbox with thousands of idle connections. With these,
// ~11 KiB. Written through the fresh /proc (relative to the template root), before anything makes
// /proc/sys read-only.
void limit_socket_buffers(child_args& a) {
    static constexpr char sizes[] = "4096 16384 1048576";  // min, initial, autotuning max
    for (const char* file : {"proc/sys/net/ipv4/tcp_rmem", "proc/sys/net/ipv4/tcp_wmem"}) {
        const long fd =
            checked(a, step::socket_buffers, SYS_openat, AT_FDCWD, file, O_WRONLY | O_CLOEXEC);
        checked(a, step::socket_buffers, SYS_write, fd, sizes, sizeof sizes - 1);
        raw(SYS_close, fd);
    }
}

// A fresh, empty session keyring: the inherited one is the embedding process's (often the login
// session's), whose keys a possessor may read. Before seccomp, which denies keyctl. A kernel built
// without keys has nothing to inherit.
void join_session_keyring(child_args& a) {
    const long result = raw(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, nullptr);
    if (result < 0 && result != -ENOSYS) child_fail(a, step::session_keyring, result);
}

// pid 1 leads its own session, without a controlling terminal, instead of staying in the
// embedding application's session.
void lead_own_session(child_args& a) {
    checked(a, step::setsid, SYS_setsid);
}

// What containers mask in /proc (runc's default masked and read-only paths): host-wide kernel
// state that is not the sandbox's. Files are covered by /dev/null, directories by an empty
// read-only tmpfs, and the rest is made read-only; entries this kernel lacks are skipped.
constexpr const char* masked_proc_files[] = {
    "/proc/kcore",      "/proc/keys",        "/proc/key-users",   "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
};
constexpr const char* masked_proc_dirs[] = {"/proc/acpi", "/proc/asound", "/proc/scsi"};
constexpr const char* read_only_proc[] = {"/proc/bus", "/proc/fs", "/proc/irq",
                                          "/proc/sysrq-trigger"};
constexpr unsigned long proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;

void bind_read_only(child_args& a, step failed, const char* path) {
    const long bound = raw(SYS_mount, path, path, nullptr, MS_BIND | MS_REC, nullptr);
    if (bound == -ENOENT) return;
    if (bound < 0) child_fail(a, failed, bound);
    checked(a, failed, SYS_mount, nullptr, path, nullptr,
            MS_BIND | MS_REMOUNT | MS_RDONLY | proc_flags, nullptr);
}

void mask_proc(child_args& a) {
    for (const char* file : masked_proc_files) {
        const long result = raw(SYS_mount, "/dev/null", file, nullptr, MS_BIND, nullptr);
        if (result < 0 && result != -ENOENT) child_fail(a, step::mask_proc, result);
    }
    for (const char* dir : masked_proc_dirs) {
        const long result =
            raw(SYS_mount, "tmpfs", dir, "tmpfs", MS_RDONLY | proc_flags, "size=0,mode=0555");
        if (result < 0 && result != -ENOENT) child_fail(a, step::mask_proc, result);
    }
    for (const char* path : read_only_proc) bind_read_only(a, step::mask_proc, path);
}

// Last of the mount steps: a sysctl the child writes for its own namespaces (net.*) must be
// written before this.
void make_proc_sys_read_only(child_args& a) {
    bind_read_only(a, step::proc_sys_read_only, "/proc/sys");
}

// Final layout: 0-2 /dev/null, 3 control, 4 slot lock, 5 agent executable (close-on-exec),
// 6 exec pipe (close-on-exec), 7 the attach socket (survivors only), 8 and 9 the commands'
// cgroup directory and cgroup.kill (v2, or the hybrid tracking tree), 10 the template layer's lock
// (template sandboxes only), 11 and 12 the commands' tasks and freezer.state in the v1 freezer
// (v1-only hosts). Sources may sit on any of the target numbers, so first move them all
// above the targets.
long move_above(child_args& a, int fd, int first_free) {
    if (fd < 0) return -1;
    return checked(a, step::arrange_fds, SYS_fcntl, fd, F_DUPFD_CLOEXEC, first_free);
}

void arrange_fds(child_args& a) {
    constexpr int first_free = 13;  // above the fds the agent looks for (3 to 12)
    const long control =
        checked(a, step::arrange_fds, SYS_fcntl, a.control, F_DUPFD_CLOEXEC, first_free);
    const long lock =
        checked(a, step::arrange_fds, SYS_fcntl, a.slot_lock, F_DUPFD_CLOEXEC, first_free);
    const long exe =
        checked(a, step::arrange_fds, SYS_fcntl, a.agent_exe, F_DUPFD_CLOEXEC, first_free);
    const long exec_pipe =
        checked(a, step::arrange_fds, SYS_fcntl, a.exec_pipe_write, F_DUPFD_CLOEXEC, first_free);
    const long listen = a.listen_socket < 0 ? -1
                                            : checked(a, step::arrange_fds, SYS_fcntl,
                                                      a.listen_socket, F_DUPFD_CLOEXEC, first_free);
    const long command_cgroup = move_above(a, a.command_cgroup, first_free);
    const long command_cgroup_kill = move_above(a, a.command_cgroup_kill, first_free);
    const long layer_lock = move_above(a, a.layer_lock, first_free);
    const long freezer_commands = move_above(a, a.freezer_commands, first_free);
    const long freezer_state = move_above(a, a.freezer_state, first_free);
    checked(a, step::arrange_fds, SYS_dup3, control, 3, 0);
    checked(a, step::arrange_fds, SYS_dup3, lock, 4, 0);
    checked(a, step::arrange_fds, SYS_dup3, exe, 5, O_CLOEXEC);
    checked(a, step::arrange_fds, SYS_dup3, exec_pipe, 6, O_CLOEXEC);
    if (listen >= 0) checked(a, step::arrange_fds, SYS_dup3, listen, 7, 0);
    if (command_cgroup >= 0) checked(a, step::arrange_fds, SYS_dup3, command_cgroup, 8, 0);
    if (command_cgroup_kill >= 0)
        checked(a, step::arrange_fds, SYS_dup3, command_cgroup_kill, 9, 0);
    if (layer_lock >= 0) checked(a, step::arrange_fds, SYS_dup3, layer_lock, 10, 0);
    if (freezer_commands >= 0) checked(a, step::arrange_fds, SYS_dup3, freezer_commands, 11, 0);
    if (freezer_state >= 0) checked(a, step::arrange_fds, SYS_dup3, freezer_state, 12, 0);
    const long null = checked(a, step::open_dev_null, SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
    for (long fd = 0; fd < 3; ++fd) {
        if (fd != null) checked(a, step::arrange_fds, SYS_dup3, null, fd, 0);
    }
    if (null > 2) raw(SYS_close, null);  // it may have landed on 7 to 12
    // The agent looks for 7 to 12: an unused number must be closed, whatever held it before.
    for (const long fd : {7L, 8L, 9L, 10L, 11L, 12L}) {
        const bool used = (fd == 7 && listen >= 0) || (fd == 8 && command_cgroup >= 0) ||
                          (fd == 9 && command_cgroup_kill >= 0) || (fd == 10 && layer_lock >= 0) ||
                          (fd == 11 && freezer_commands >= 0) || (fd == 12 && freezer_state >= 0);
        if (!used) raw(SYS_close, fd);
    }
    checked(a, step::close_range, SYS_close_range, first_free, ~0u, 0);
}

}  // namespace

int child_main(void* opaque) {
    auto& a = *static_cast<child_args*>(opaque);
    raw(SYS_close, a.release_write);
    char byte = 0;
    long got;
    do {
        got = raw(SYS_read, a.release_read, &byte, 1);
    } while (got == -EINTR);
    if (got != 1) child_fail(a, step::wait_release, got == 0 ? -ECANCELED : got);
    // The parent may have cloned with a root file system uid (CLONE_INTO_CGROUP): from here on
    // files are reached as the sandbox's root, its mapped uid 0 (the maps are written now).
    raw(SYS_setfsuid, 0);
    raw(SYS_setfsgid, 0);
    // Join the sandbox's cgroups by moving itself (see cgroups::open_join), before the
    // cgroup namespace is made so that its root is the sandbox's cgroup.
    for (const int fd : a.attach_fds) {
        if (fd >= 0) checked(a, step::cgroup_attach, SYS_write, fd, "0", 1);
    }
    if (a.unified_before_namespace >= 0)
        checked(a, step::cgroup_attach, SYS_write, a.unified_before_namespace, "0", 1);
    checked(a, step::cgroup_namespace, SYS_unshare, CLONE_NEWCGROUP);
    // Under nsdelegate the namespace's root is the sandbox's own v2 cgroup; pid 1 lives in init.
    if (a.unified_after_namespace >= 0)
        checked(a, step::cgroup_attach, SYS_write, a.unified_after_namespace, "0", 1);

    // Without setgroups the child would keep host gid 0 as a supplementary group. pid 1 takes the
    // sandbox's group (its uid stays 0 in the namespace), so that commands, which inherit it,
    // change only their uid; and before the parent-death signal, which a gid change would clear.
    const gid_t group = wire::sandbox_group_id;
    checked(a, step::setgroups, SYS_setgroups, 1, &group);
    checked(a, step::setresgid, SYS_setresgid, group, group, group);
    // Copied mounts are locked in a user namespace and cannot be pivot_root targets, hence the
    // fresh recursive bind of the template (reachable through the 0711 state directory).
    checked(a, step::bind_template, SYS_mount, a.template_path, a.template_path, nullptr,
            MS_BIND | MS_REC, nullptr);
    checked(a, step::chdir_template, SYS_chdir, a.template_path);
    checked(a, step::setresuid, SYS_setresuid, 0, 0, 0);
    join_session_keyring(a);
    lead_own_session(a);

    // After setresuid: changing the euid clears the parent-death signal. The helper keeps the
    // release pipe's write end open until exec, so a hang-up means it already died.
    if (!a.survive_owner) {
        checked(a, step::pdeathsig, SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        pollfd owner{a.release_read, POLLIN, 0};
        timespec zero{};
        checked(a, step::owner_gone, SYS_ppoll, &owner, 1, &zero, nullptr, 0);
        if ((owner.revents & (POLLHUP | POLLERR)) != 0) child_fail(a, step::owner_gone, -ESRCH);
    }

    // The Python environment of a template sandbox lives under its /opt/moat, which only a
    // layer whose /opt is a directory gets.
    bool moat_commands = true;
    if (a.layer_socket >= 0) moat_commands = build_layer_root(a);
    if (a.python != nullptr && moat_commands) write_python_env(a);
    // A fresh /proc may only be mounted while a full one is visible: before pivot_root.
    checked(a, step::mount_proc, SYS_mount, "proc", "proc", "proc",
            MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    limit_socket_buffers(a);
    if (a.has_layout_etc && a.layer_socket < 0) bind_layout_etc(a);
    mount_tmpfs(a, step::mount_tmp, "tmp", a.tmp_options);
    mount_tmpfs(a, step::mount_shm, "dev/shm", a.tmp_options);
    mount_devpts(a);
    mount_tmpfs(a, step::mount_workspace, "workspace", a.workspace_options);
    if (a.mount_home) mount_tmpfs(a, step::mount_home, "home", a.home_options);
    // Root's home, writable by root only (owned by the sandbox's uid and gid 0): of /home's size,
    // charged to the same memory cgroup.
    mount_tmpfs(a, step::mount_root, "root", a.root_options);
    make_layout_dirs(a);
    checked(a, step::pivot_root, SYS_pivot_root, ".", ".");
    checked(a, step::umount_old_root, SYS_umount2, ".", MNT_DETACH);
    checked(a, step::chdir_root, SYS_chdir, "/");
    mask_proc(a);

    checked(a, step::sethostname, SYS_sethostname, "sandbox", 7);
    bring_up_loopback(a);
    make_proc_sys_read_only(a);
    const rlimit no_core{0, 0};
    checked(a, step::rlimit_core, SYS_prlimit64, 0, RLIMIT_CORE, &no_core, nullptr);
    arrange_fds(a);

    checked(a, step::no_new_privs, SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    checked(a, step::seccomp, SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &a.filter);
    const long result = raw(SYS_execveat, 5, "", a.argv, a.envp, AT_EMPTY_PATH);
    child_fail(a, step::execveat, result);
}

const char* step_name(int failed_step) {
    return step_names[failed_step];
}

}  // namespace moat::sandboxd
