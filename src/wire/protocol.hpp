// Wire format shared by the library, the sandbox helper (moat-sandboxd helper) and the pid-1 agent
// (moat-sandboxd agent). All three are built from this one header at the same commit (the helper is
// embedded in the library), so the format is fixed-layout structs in host byte order. Every message
// travels as one SOCK_SEQPACKET record that starts with `header`; `header::size` is the record's
// total length. Records that carry file descriptors attach them with SCM_RIGHTS.
//
// The library treats what the agent sends as untrusted and reads a record only through these
// checks: read_header() (the size field must equal the record's length), read_fixed() (the type
// and the exact size), decode_exec() (every count, length and terminator); a fixed string field is
// read with read_field(), which never runs past the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moat::wire {

// 2: set_ttl / ttl_set; exec requests the agent cannot run are answered.
// 3: created carries the cpu cgroup; survivors' agents accept attach connections.
// 4: exec_own_cgroup / exited_strays_killed; layer_command_cgroups; created.tracking_cgroup.
// 5: create carries the sandbox layout (user name, home, workdir, artifacts_dir).
// 6: exec_resident.
// 7: create.egress_port; ready.egress_port, with the sandbox's egress listener attached.
// 8: connect_port / port_connected, with a socket connected inside the sandbox attached.
// 9: connect_unix (a unix-domain stream socket in the sandbox), answered by port_connected.
// 10: watch_* (file watches) and pty_* (terminals).
// 11: create.template_layer (a writable root over a template's layer); set_paused / paused_set
//     (pause and resume: pid 1's clocks while the commands are frozen); exec_as_root;
//     create_allow_sudo (pid 1's sudo socket, sudo_socket_name); create.template_python (the
//     interpreter of a template's Python environment).
inline constexpr std::uint32_t protocol_version = 11;

// Largest record any side sends or accepts (exec requests carry argv, env and cwd).
inline constexpr std::size_t max_message_bytes = 128 * 1024;

// Inside the sandbox: pid 1 runs as root of the user namespace; commands run as this user.
inline constexpr std::uint32_t sandbox_user_id = 1000;
inline constexpr std::uint32_t sandbox_group_id = 1000;
// The template root's directory of command aliases (`python` -> /usr/bin/python3 where the host
// has no python; sandboxd/template_root.hpp), last on the default PATH of commands.
inline constexpr std::string_view command_alias_dir = "/opt/moat/bin";
// A template layer's lock file is its directory's path with this suffix (template_store's
// lock_path_of, and the helper, which holds it shared for each sandbox of the layer).
inline constexpr std::string_view layer_lock_suffix = ".lock";
// Every sandbox whose root has python3: its own Python environment (a --system-site-packages
// virtual environment on a tmpfs of the sandbox's, written by pid 1 at create; sandboxd/
// python_env.hpp), whose bin/ comes first on the default PATH of commands.
inline constexpr std::string_view python_env_dir = "/opt/moat/python";
// "3.11" for a path whose file name is python3.11 (the form of create_message::template_python
// and of the base root's interpreter), else "".
inline std::string_view python_version(std::string_view path) {
    const std::string_view name = path.substr(path.rfind('/') + 1);
    constexpr std::string_view prefix = "python3.";
    if (!name.starts_with(prefix) || name.size() == prefix.size() ||
        name.size() > prefix.size() + 3)
        return {};
    for (const char c : name.substr(prefix.size())) {
        if (c < '0' || c > '9') return {};
    }
    return name.substr(std::string_view("python").size());
}
// Each sandbox maps [0, uid_range_size) onto a host range of its own, never host root.
inline constexpr std::uint32_t uid_range_size = 65536;

enum class message_type : std::uint32_t {
    // helper -> library, once, right after start
    hello = 1,
    // library -> helper
    create = 10,
    destroy = 11,
    // helper -> library
    created = 20,  // SCM_RIGHTS: [pidfd of pid 1, library end of the agent control socket]
    create_failed = 21,
    reaped = 22,  // pid 1 was reaped and the cgroups removed (reply to destroy, or unsolicited)
    // library -> agent
    exec = 30,  // SCM_RIGHTS: [stdin, stdout, stderr]
    kill = 31,
    set_ttl = 32,
    connect_port = 33,
    connect_unix = 34,
    watch_dir = 35,  // SCM_RIGHTS: [] (a new inotify instance) or [the inotify instance to add to]
    set_paused = 36,
    pty_attach = 37,  // another duplicate of a running terminal command's master (pty_attached)
    // agent -> library
    ready = 40,  // SCM_RIGHTS: [the egress listener] when ready_message::egress_port != 0
    started = 41,
    exited = 42,
    ttl_set = 43,  // reply to set_ttl
    // reply to connect_port and connect_unix; SCM_RIGHTS: [the socket] when it succeeded
    port_connected = 44,
    // reply to watch_dir; SCM_RIGHTS: [the new inotify instance] when the request attached none
    // and the watch was added
    watch_added = 45,
    paused_set = 46,  // reply to set_paused
    // reply to pty_attach; SCM_RIGHTS: [the terminal's master] when it succeeded
    pty_attached = 47,
};

struct header {
    std::uint32_t type;  // message_type
    std::uint32_t size;  // whole record, header included
};

// Isolation layers, reported by the helper (hello: what this host can do; created: what was
// actually applied to that sandbox).
enum layer_bits : std::uint32_t {
    layer_user_ns = 1u << 0,
    layer_pid_ns = 1u << 1,
    layer_mount_ns = 1u << 2,
    layer_net_ns = 1u << 3,
    layer_ipc_ns = 1u << 4,
    layer_uts_ns = 1u << 5,
    layer_cgroup_ns = 1u << 6,
    layer_seccomp = 1u << 7,
    layer_cgroup_memory = 1u << 8,
    layer_cgroup_pids = 1u << 9,
    layer_cgroup_cpu = 1u << 10,
    layer_no_new_privs = 1u << 11,
    // created only: the sandbox has a cgroup v2 tree (its own, or a hybrid host's tracking tree)
    // in which each exec gets a cgroup of its own (see exec_own_cgroup).
    layer_command_cgroups = 1u << 12,
};

inline constexpr std::size_t sandbox_id_bytes = 32;    // ASCII, NUL padded
inline constexpr std::size_t detail_bytes = 256;       // NUL terminated
inline constexpr std::size_t path_bytes = 512;         // NUL terminated
inline constexpr std::size_t user_name_bytes = 33;     // NUL terminated (sandbox_layout)
inline constexpr std::size_t layout_path_bytes = 256;  // NUL terminated (sandbox_layout)
inline constexpr std::size_t unix_path_bytes = 108;    // NUL terminated: sockaddr_un::sun_path

struct hello_message {
    header h;
    std::uint32_t version;      // protocol_version
    std::uint32_t host_layers;  // layer_bits the host supports
    // 0, or the moat::errc for which this helper cannot create any sandbox (its setup failed:
    // not root, an unreachable state directory); layer_detail then says why.
    std::int32_t setup_error;
    std::uint8_t reserved[4];
    char layer_detail[detail_bytes];  // why a layer is missing, if one is
};

enum create_flags : std::uint32_t {
    create_best_effort = 1u << 0,    // a layer that cannot be enforced is skipped, not an error
    create_survive_owner = 1u << 1,  // the agent does not exit when its control socket closes
    create_allow_sudo = 1u << 2,     // pid 1 runs what the sandbox's sudo shim asks, as root
};

struct create_message {
    header h;
    std::uint64_t request_id;
    char sandbox_id[sandbox_id_bytes];
    // The library always sends every limit (resource_limits::with_defaults); 0 keeps the
    // kernel's "no limit" for the low-level tests of the helper.
    std::uint64_t memory_bytes;     // cgroup memory limit (v1: and TCP buffers); 0 = none
    std::uint64_t workspace_bytes;  // tmpfs size of /workspace
    std::uint64_t tmp_bytes;        // tmpfs size of /tmp and of /dev/shm
    std::uint64_t ttl_ms;           // pid 1 ends the sandbox after this long; 0 = never
    std::uint32_t pids_max;         // cgroup pids limit; 0 = none
    std::uint32_t cpu_millicores;   // cgroup cpu quota, 1000 = one core; 0 = none
    std::uint32_t flags;            // create_flags
    std::uint32_t open_files;       // RLIMIT_NOFILE (soft and hard) in the sandbox; 0 = inherited
    // 0, or the port pid 1 listens on at 127.0.0.1 inside the sandbox for the egress proxy.
    std::uint32_t egress_port;
    std::uint32_t reserved;
    // The sandbox layout (sandbox_layout, validated by the library); "" keeps a field's default:
    // the template's user name, /workspace, /workspace, /workspace/out.
    char user_name[user_name_bytes];
    char home[layout_path_bytes];
    char workdir[layout_path_bytes];
    char artifacts_dir[layout_path_bytes];
    // "" for the default (read-only) root; else the absolute path of the template layer the
    // sandbox's root is an overlay of (templates.hpp), which the helper mounts idmapped.
    char template_layer[path_bytes];
    // A template sandbox: the absolute path inside the layer of the template's python3
    // interpreter, named python3.N (templates.hpp, template_info::python), or "" when the
    // template has none (the sandbox then gets no Python environment). Ignored without a layer.
    char template_python[path_bytes];
};

struct created_message {
    header h;
    std::uint64_t request_id;
    std::int32_t host_pid;         // pid 1 of the sandbox, as the host sees it
    std::uint32_t uid_base;        // host uid that sandbox uid 0 maps to
    std::uint32_t applied_layers;  // layer_bits
    std::uint32_t reserved;
    std::uint64_t start_time_ticks;  // field 22 of /proc/<host_pid>/stat, for pid-reuse checks
    char memory_cgroup[path_bytes];  // absolute path of the sandbox's v1 memory cgroup, or ""
    char pids_cgroup[path_bytes];    // absolute path of the sandbox's v1 pids cgroup, or ""
    char cpu_cgroup[path_bytes];     // absolute path of the sandbox's v1 cpu cgroup, or ""
    // The cgroup whose `commands` child holds every process of the sandbox but pid 1, where pause
    // freezes them: on hybrid hosts the sandbox's tracking tree in the unified hierarchy
    // (per-command cgroups), on v1-only hosts its v1 freezer cgroup; or "". Whoever confirms the
    // sandbox gone removes it with the others.
    char tracking_cgroup[path_bytes];
};

struct create_failed_message {
    header h;
    std::uint64_t request_id;
    std::int32_t error_code;  // a moat::errc value
    std::int32_t sys_errno;   // the failing system call's errno, or 0
    char detail[detail_bytes];
};

struct destroy_message {
    header h;
    char sandbox_id[sandbox_id_bytes];
};

struct reaped_message {
    header h;
    char sandbox_id[sandbox_id_bytes];
    std::int32_t wait_status;    // pid 1's status from waitid, as a waitpid-style status word
    std::int32_t cleanup_errno;  // first error removing the cgroups, or 0
};

enum exec_flags : std::uint32_t {
    exec_none = 0,
    // A command (exec, exec_stream; not spawn) whose whole process tree ends with its main
    // process: the agent runs it in a cgroup of its own, where the sandbox has per-command cgroups,
    // and kills whatever is left in it when the main process exits.
    exec_own_cgroup = 1u << 0,
    // A sandbox service (a spawn with exec_request::resident): it does not end with the
    // connection that started it, runs in a cgroup of its own (where the sandbox has per-command
    // cgroups) so the idle sweep spares it and its own leftovers die with it, and ends by itself,
    // by its wall limit or with the sandbox.
    exec_resident = 1u << 1,
    // A command on a terminal of its own (exec_message::rows and cols, each 1..max_terminal_side):
    // the record carries no descriptors; pid 1 opens a pseudo-terminal on the sandbox's own
    // devpts, the child gets its slave as stdin, stdout, stderr and controlling terminal, and
    // `started` carries a duplicate of the master. pid 1 keeps one until the command exits, for
    // pty_attach.
    exec_terminal = 1u << 2,
    // As the sandbox's root (uid 0, gid 0) with exactly root_capabilities (effective, permitted
    // and bounding; ambient and inheritable empty), seccomp and no_new_privs as for every
    // command. Without it a command runs as sandbox_user_id with no capabilities at all.
    exec_as_root = 1u << 3,
};

// The capabilities of a command run as the sandbox's root (exec_as_root, sudo), in the sandbox's
// user namespace only: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP and
// NET_BIND_SERVICE (bits 0, 1, 3-8 and 10). Never NET_RAW, MKNOD, SETFCAP, AUDIT_WRITE,
// SYS_CHROOT, nor anything with ADMIN, PTRACE or MODULE in its name.
inline constexpr std::uint64_t root_capabilities = 0x5fbull;

// pid 1's sudo socket: a SOCK_SEQPACKET unix socket in the abstract namespace of the sandbox's
// own network namespace (reachable from inside that sandbox only), bound by pid 1 before any
// command runs. The sandbox's sudo shim (`moat-sandboxd` run as `sudo`) sends one exec record
// (its stdin, stdout and stderr attached) and may send kill records for it; pid 1 answers
// `started` and `exited` as to the library, or `exited` with exited_spawn_failed and EPERM when
// the sandbox was created without create_allow_sudo.
inline constexpr std::string_view sudo_socket_name = "moat-sudo";

// The largest number of rows or columns a terminal may have (and the smallest is 1).
inline constexpr std::uint32_t max_terminal_side = 1000;

// Followed by `argc` argv strings, then `envc` "K=V" strings, then the working directory; each
// NUL terminated. argv[0] is looked up in the PATH of the given environment.
struct exec_message {
    header h;
    std::uint64_t exec_id;
    std::uint64_t wall_limit_ms;  // 0 = no limit; the agent kills the process group at the limit
    std::uint32_t argc;
    std::uint32_t envc;
    std::uint32_t flags;  // exec_flags
    std::uint16_t rows;   // exec_terminal only, else 0
    std::uint16_t cols;   // exec_terminal only, else 0
};

struct kill_message {
    header h;
    std::uint64_t exec_id;
    std::int32_t signal;  // sent to the command's whole process group
    std::uint32_t reserved;
};

// Moves the sandbox's end to ttl_ms from now (0: no TTL). The agent answers ttl_set with the same
// request_id.
struct set_ttl_message {
    header h;
    std::uint64_t request_id;
    std::uint64_t ttl_ms;
};

struct ttl_set_message {
    header h;
    std::uint64_t request_id;
};

// Pause or resume (the library freezes and thaws the commands' cgroup itself; pid 1 is never
// frozen). paused = 1: the commands' wall limits stop counting and the sandbox ends ttl_ms from now
// (its paused lifetime; 0: no limit); paused = 0: the wall limits count again, moved by the time
// spent paused, and the sandbox ends ttl_ms from now (what was left of its TTL). The agent answers
// paused_set with the same request_id.
struct set_paused_message {
    header h;
    std::uint64_t request_id;
    std::uint64_t ttl_ms;
    std::uint32_t paused;
    std::uint32_t reserved;
};

struct paused_set_message {
    header h;
    std::uint64_t request_id;
};

// Asks pid 1 for a TCP connection to `port` on the sandbox's own loopback (127.0.0.1 or ::1),
// made in the sandbox's network namespace and handed out: the library reaches a server in the
// sandbox without the sandbox getting a route. The agent answers port_connected with the same
// request_id. It never connects to a port of its own (the egress listener).
struct connect_port_message {
    header h;
    std::uint64_t request_id;
    std::uint32_t port;    // 1-65535
    std::uint32_t family;  // 4: 127.0.0.1, 6: ::1
};

// Asks pid 1 for a stream connection to the unix-domain socket at `path` in the sandbox's
// filesystem, made without blocking (a full backlog is EAGAIN) and handed out: the agent answers
// port_connected with the same request_id. A path that is not absolute, empty or unterminated
// within the field is EINVAL.
struct connect_unix_message {
    header h;
    std::uint64_t request_id;
    char path[unix_path_bytes];  // read with read_field
    std::uint8_t reserved[4];
};

// Why `path` cannot name a unix socket for connect_unix (a short phrase), or nullptr: it must be
// absolute and fit sun_path with its terminator, without a NUL of its own. The one copy of the
// rule, for the library (before it sends) and the agent (on what it receives).
const char* unix_path_problem(std::string_view path) noexcept;

enum port_connected_flags : std::uint32_t {
    // The connect was still under way (a full accept backlog): the library waits for the socket
    // to become writable and reads SO_ERROR.
    port_connect_in_progress = 1u << 0,
};

struct port_connected_message {
    header h;
    std::uint64_t request_id;
    std::int32_t connect_errno;  // 0: the socket is attached; else why not (ECONNREFUSED, EPERM)
    std::uint32_t flags;         // port_connected_flags
};

// Asks pid 1 to add an inotify watch on a directory of the sandbox: `base` (an absolute path,
// symlinks followed inside the sandbox, as any path a process there opens), then each component
// of `relative` (a path below it, "" for base itself) opened without following a symlink, so a
// subdirectory swapped for a link while the library asked is refused (ENOTDIR), never watched
// elsewhere. The watch is added by descriptor (O_PATH, IN_ONLYDIR): no second lookup of the
// path. With no descriptor attached, pid 1 makes a new inotify instance (IN_CLOEXEC |
// IN_NONBLOCK) and hands it out with the answer; with one attached (the library's instance) it
// adds the watch there and closes its copy: pid 1 keeps nothing. Followed by `base_bytes` bytes of
// base, then `relative_bytes` bytes of relative (no terminators). The agent answers watch_added
// with the same request_id.
struct watch_dir_message {
    header h;
    std::uint64_t request_id;
    std::uint32_t mask;  // inotify event bits (IN_ONLYDIR is added)
    std::uint32_t base_bytes;
    std::uint32_t relative_bytes;
    std::uint32_t reserved;
};

struct watch_added_message {
    header h;
    std::uint64_t request_id;
    std::int32_t watch_errno;  // 0: added; else why not (ENOENT, ENOTDIR, EACCES, EMFILE, ENOSPC)
    std::int32_t watch_descriptor;  // the inotify watch descriptor when added
};

// The longest `base` plus `relative` a watch_dir record carries (PATH_MAX without its NUL).
inline constexpr std::size_t max_watch_path_bytes = 4095;

// Appends a watch_dir record to `out`. False (out untouched) if a path contains a NUL byte, base
// is not absolute, or the two are longer than max_watch_path_bytes together.
bool encode_watch_dir(std::uint64_t request_id, std::uint32_t mask, std::string_view base,
                      std::string_view relative, std::vector<std::byte>& out);

struct watch_dir_view {
    std::uint64_t request_id = 0;
    std::uint32_t mask = 0;
    std::string_view base;  // views into the record
    std::string_view relative;
};

// Parses a watch_dir record; false if a length, the record's size or a path breaks the rules of
// encode_watch_dir.
bool decode_watch_dir(std::span<const std::byte> record, watch_dir_view& out);

struct ready_message {
    header h;
    std::uint32_t version;
    // 0, or the port of the sandbox's egress listener (127.0.0.1 in its network namespace); the
    // record then carries a dup of that listening TCP socket, for the library to accept on.
    std::uint32_t egress_port;
};

// SCM_RIGHTS: [a duplicate of the terminal's master] for an exec_terminal command, else none.
struct started_message {
    header h;
    std::uint64_t exec_id;
    std::int32_t pid;  // inside the sandbox's pid namespace; also the process group id
    std::uint32_t reserved;
};

// Asks pid 1 for another duplicate of the master of the running terminal command `pid` (any
// connection's, by its pid in the sandbox, since exec ids are each connection's own). From the
// answer on, this connection follows the command under its own `exec_id`: it gets `exited` with
// that id when the command ends and may signal it with kill; its own end does not end the
// command (only the starting connection's does, for a command that is not resident).
struct pty_attach_message {
    header h;
    std::uint64_t exec_id;  // chosen by this connection, unused by its other commands
    std::int32_t pid;
    std::uint32_t reserved;
};

// SCM_RIGHTS: [the master] when attach_errno is 0. ESRCH: no running terminal command has that
// pid; EMFILE: pid 1 could not duplicate it; EBUSY: exec_id is in use on this connection.
struct pty_attached_message {
    header h;
    std::uint64_t exec_id;
    std::int32_t attach_errno;
    std::uint32_t reserved;
};

enum exited_flags : std::uint32_t {
    exited_timed_out = 1u << 0,      // the agent killed it at the wall limit
    exited_spawn_failed = 1u << 1,   // exec of argv[0] failed; spawn_errno says why
    exited_strays_killed = 1u << 2,  // processes it left behind were killed when it exited
};

struct exited_message {
    header h;
    std::uint64_t exec_id;
    std::int32_t wait_status;  // waitpid-style status word
    std::uint32_t flags;       // exited_flags
    std::int32_t spawn_errno;
    std::uint32_t reserved;
    std::uint64_t duration_us;  // from fork to exit, measured by the agent
};

// Reads the header of a record; false if the record is too short or its size field lies.
bool read_header(std::span<const std::byte> record, header& out) noexcept;

// Copies a whole fixed-size message out of a record if its type and size match exactly.
template <class Message>
bool read_fixed(std::span<const std::byte> record, message_type type, Message& out) noexcept {
    header h{};
    if (!read_header(record, h) || h.type != static_cast<std::uint32_t>(type) ||
        h.size != sizeof(Message)) {
        return false;
    }
    std::memcpy(&out, record.data(), sizeof(Message));
    return true;
}

// Builds a fixed-size message with its header filled in and everything else zeroed.
template <class Message>
Message make_message(message_type type) noexcept {
    Message m{};
    m.h.type = static_cast<std::uint32_t>(type);
    m.h.size = sizeof(Message);
    return m;
}

// Copies `text` into a fixed NUL-terminated field, truncating; the field is always terminated.
void copy_field(std::span<char> field, std::string_view text) noexcept;

// Reads a fixed NUL-terminated field; stops at the first NUL or at the field's end.
std::string_view read_field(std::span<const char> field) noexcept;

struct exec_request_view {
    std::uint64_t exec_id = 0;
    std::uint64_t wall_limit_ms = 0;
    std::uint32_t flags = 0;
    std::uint16_t rows = 0;  // exec_terminal only
    std::uint16_t cols = 0;
    std::vector<std::string_view> argv;  // views into the record
    std::vector<std::string_view> env;
    std::string_view cwd;
};

// A terminal's size in an exec record (exec_terminal).
struct terminal_size {
    std::uint16_t rows = 0;
    std::uint16_t cols = 0;
};

// Appends an exec record to `out`. False (out untouched) if the record would exceed
// max_message_bytes, argv is empty, a string contains a NUL byte, or exec_terminal is set
// without a size within 1..max_terminal_side (the size is sent only with exec_terminal).
bool encode_exec(std::uint64_t exec_id, std::uint64_t wall_limit_ms,
                 std::span<const std::string> argv, std::span<const std::string> env,
                 std::string_view cwd, std::vector<std::byte>& out, std::uint32_t flags = exec_none,
                 terminal_size size = {});

// Parses an exec record; false if any count, length or terminator is inconsistent, or the
// terminal size is out of bounds (or present without exec_terminal).
bool decode_exec(std::span<const std::byte> record, exec_request_view& out);

}  // namespace moat::wire
