// Running a command in a sandbox: the request, the result, and the pull-based output stream.
//
// What the program did is data in exec_result (exit code, signal, wall-limit timeout, OOM kill,
// truncated output); only a failure of moat or of the caller's own budget is a moat::error.
#pragma once

#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace moat {

// How much of each output stream exec() keeps: the first head_bytes and the last tail_bytes.
// Memory use is fixed whatever the program prints; the rest is counted, not kept.
struct output_limits {
    std::size_t head_bytes = 512 * 1024;
    std::size_t tail_bytes = 512 * 1024;
};

struct exec_request {
    // The program and its arguments; argv[0] is looked up in PATH. Alternatively leave argv empty
    // and set `shell`, which runs as /bin/sh -c shell.
    std::vector<std::string> argv;
    std::string shell;
    // Added to (and overriding) the sandbox's environment.
    std::map<std::string, std::string> env;
    // Working directory inside the sandbox; "" means the sandbox's workdir.
    std::string cwd;
    // Bytes written to the program's stdin, which is then closed.
    std::string stdin_data;
    // Program limit: the whole process group is killed this long after start and the result says
    // timed_out with exit code 124. At most max_wall_limit, or max_spawn_wall_limit for a
    // spawned process (backend::async_spawn, sandbox::async_spawn).
    std::chrono::milliseconds wall_limit = std::chrono::seconds(60);
    output_limits output;
    // Spawn only (backend::async_spawn, sandbox::async_spawn): a resident of the sandbox, owned
    // by no caller. It keeps running when the handle is dropped, when the backend that started it
    // detaches or its process exits (another backend attached to the sandbox, another worker, may
    // use what it serves), and ends by itself, by its wall limit, by a signal, or with the sandbox
    // (destroy, TTL). Its stdio reaches the handle only while the handle lives: a resident that
    // outlives it must stop using its stdio (point it at /dev/null). Local backend: it runs in a
    // cgroup of its own, where the sandbox has per-command cgroups; what it leaves behind when it
    // exits is killed then, and the sweep of an idle sandbox's strays spares it. On E2B every
    // process started through envd keeps running when its client disconnects.
    bool resident = false;
    // Run as the sandbox's root (uid 0 inside, never root on the host) instead of its user.
    // Local backend: gid 0, HOME=/root unless env or the spec sets it, and exactly the
    // capabilities CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETUID, SETGID, SETPCAP and
    // NET_BIND_SERVICE, inside the sandbox's user namespace only; seccomp and no_new_privs stay
    // (docs/security.md, "The sandbox's root"). e2b backend: envd's user "root".
    bool as_root = false;

    static constexpr std::chrono::milliseconds max_wall_limit = std::chrono::seconds(600);
    // A spawned process is a service that lives across calls (an interpreter kept per session):
    // it may run this long, and it still ends with its sandbox (TTL, destroy).
    static constexpr std::chrono::milliseconds max_spawn_wall_limit = std::chrono::hours(24);
};

// One stream's output as kept by exec(): everything if it fit, else head + tail.
struct captured_output {
    std::string head;
    std::string tail;                 // empty unless truncated
    std::uint64_t total_bytes = 0;    // what the program wrote
    std::uint64_t omitted_bytes = 0;  // total_bytes - head.size() - tail.size()

    bool is_truncated() const noexcept { return omitted_bytes != 0; }
    // head, then "\n[... N bytes omitted ...]\n" when truncated, then tail.
    std::string text() const;
};

struct exec_result {
    // The exit status; 128 + signal when killed by a signal; 124 when the wall limit ended it.
    int exit_code = 0;
    int signal = 0;          // the terminating signal, or 0
    bool timed_out = false;  // the wall limit ended it
    // The sandbox's memory limit ended it: the command died of SIGKILL (or, run through a shell,
    // exited 137) while the sandbox's memory cgroup counted an OOM kill.
    bool oom_killed = false;
    // Processes the command left running (background jobs, daemons, anything that called setsid)
    // were killed when its main process exited: a command's processes end with it. Long-lived
    // services belong in backend::async_spawn, whose processes are not stopped this way. Local
    // backend only, and only where the sandbox has per-command cgroups (cgroup v2 or a hybrid
    // host's unified hierarchy; docs/security.md); always false elsewhere.
    bool strays_killed = false;
    captured_output out;  // stdout (empty for a streamed exec: the chunks carried it)
    captured_output err;  // stderr
    std::chrono::microseconds duration{0};  // from start to exit, measured in the sandbox
};

enum class output_channel { out, err };

struct output_chunk {
    output_channel channel;
    std::string data;
};

// A running command's output, pulled by the caller. Nothing is read from the program until the
// caller asks: a caller that stops pulling stops the pump, and the pipe pushes back on the program.
// Destroying the stream before the end kills the program.
class exec_stream {
  public:
    struct impl {
        virtual ~impl() = default;
        virtual asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() = 0;
    };

    exec_stream() = default;
    explicit exec_stream(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

    // The next chunk of stdout or stderr, and after both have ended, the exec_result (with empty
    // captured output and byte counts). Calling again after the result is an error.
    // Per-Operation Cancellation: terminal. The program is killed and the call completes with
    // errc::cancelled once its end is confirmed (within the backend's kill grace, 2 s by
    // default); if it is not confirmed in time, with errc::backend_failure instead. Either way
    // the stream is finished. Dropping a stream before its end kills the program too.
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() {
        return impl_->async_next();
    }

    explicit operator bool() const noexcept { return impl_ != nullptr; }

  private:
    std::unique_ptr<impl> impl_;
};

// A background process started by backend::async_spawn (or sandbox::async_spawn): it does not
// hold the sandbox's operation queue. Output is pulled like an exec_stream (the last item is the
// exec_result; an unread pipe pushes back on the program); stdin stays open until closed or the
// process ends. The request's wall limit still applies. Destroying the handle before the end
// kills the process, as does destroying its sandbox.
//
// async_write_stdin: writes all of `data`, waiting while the program does not read (terminal
// cancellation stops the wait: errc::cancelled); errc::invalid_argument once stdin was closed or
// the program stopped reading it for good. async_signal sends a signal to the process group.
class process {
  public:
    struct impl {
        virtual ~impl() = default;
        virtual std::uint64_t id() const = 0;
        virtual int pid() const = 0;
        virtual asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() = 0;
        virtual asio::awaitable<result<void>> async_write_stdin(std::string data) = 0;
        virtual asio::awaitable<result<void>> async_close_stdin() = 0;
        virtual asio::awaitable<result<void>> async_signal(int signal) = 0;
    };

    process() = default;
    explicit process(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

    // The backend's id for it (for backend::async_signal) and its pid inside the sandbox.
    std::uint64_t id() const { return impl_->id(); }
    int pid() const { return impl_->pid(); }
    explicit operator bool() const noexcept { return impl_ != nullptr; }
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() {
        return impl_->async_next();
    }
    asio::awaitable<result<void>> async_write_stdin(std::string data) {
        return impl_->async_write_stdin(std::move(data));
    }
    asio::awaitable<result<void>> async_close_stdin() { return impl_->async_close_stdin(); }
    asio::awaitable<result<void>> async_signal(int signal) { return impl_->async_signal(signal); }

  private:
    std::unique_ptr<impl> impl_;
};

}  // namespace moat
