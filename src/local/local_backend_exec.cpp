// Commands in the local backend's sandboxes (local_backend_impl.hpp is the contract between its
// files): exec, spawn, signal and terminals. A command is one `exec` record to the sandbox's agent
// with its stdio (stdin a socket, stdout and stderr pipes) and environment; its output stream owns
// it from the moment the record is sent.
#include "local/local_backend_impl.hpp"

#include "core/asio_compat.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "egress/network_policy.hpp"
#include "local/agent_channel.hpp"
#include "local/local_exec_stream.hpp"
#include "local/local_process.hpp"
#include "local/local_terminal.hpp"
#include "local/spec_validation.hpp"
#include "wire/protocol.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace moat {
namespace {

constexpr auto start_timeout = std::chrono::seconds(10);
// How long past its wall limit a command may run before moat concludes the agent failed to kill it.
constexpr auto wall_limit_slack = std::chrono::seconds(5);

// Writes the stdin bytes, then closes. Ends early (EPIPE, never SIGPIPE) if the program exits.
asio::awaitable<void> feed_stdin(std::shared_ptr<asio::posix::stream_descriptor> socket,
                                 std::string data) {
    auto token = as_tuple(asio::use_awaitable);
    std::size_t offset = 0;
    while (offset < data.size()) {
        auto [ec] = co_await socket->async_wait(asio::posix::descriptor_base::wait_write, token);
        if (ec) break;
        const ssize_t n = ::send(socket->native_handle(), data.data() + offset,
                                 data.size() - offset, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EINTR) break;
        if (n > 0) offset += static_cast<std::size_t>(n);
    }
    std::error_code ignored;
    socket->close(ignored);
}

}  // namespace

// A command the agent has started: its output stream (which owns it: dropping the stream
// kills it) and, for spawn, our end of its stdin.
struct local_backend::started_command {
    std::unique_ptr<local_exec_stream> stream;
    unique_fd stdin_socket;
    unique_fd master;  // a terminal command's (its stream reads a duplicate)
    std::shared_ptr<agent_channel> agent;
    std::uint64_t exec_id = 0;
    int pid = 0;
};

struct local_backend::stdio_set {
    unique_fd stdin_ours, stdin_theirs, out_ours, out_theirs, err_ours, err_theirs;
};

asio::awaitable<result<exec_stream>> local_backend::async_exec_stream(std::string id,
                                                                      exec_request request) {
    return guarded(start_exec(std::move(id), std::move(request)));
}

asio::awaitable<result<process>> local_backend::async_spawn(std::string id, exec_request request) {
    return guarded(spawn(std::move(id), std::move(request)));
}

asio::awaitable<result<void>> local_backend::async_signal(std::string id, std::uint64_t process_id,
                                                          int signal) {
    auto found = find(id);
    if (!found) co_return std::move(found).error();
    if ((*found)->gone_reason)
        co_return make_error(errc::sandbox_unavailable, *(*found)->gone_reason);
    if (!(*found)->agent) co_return make_error(errc::sandbox_unavailable, "the sandbox has ended");
    co_return signal_command(*(*found)->agent, process_id, signal);
}

asio::awaitable<result<exec_stream>> local_backend::start_exec(std::string id,
                                                               exec_request request) {
    std::string stdin_data = std::move(request.stdin_data);
    // An exec's processes end with it (its own cgroup, where the sandbox has them).
    const auto ceiling = exec_request::max_wall_limit;
    auto started =
        co_await start_command(std::move(id), std::move(request), ceiling, wire::exec_own_cgroup);
    if (!started) co_return std::move(started).error();
    if (!stdin_data.empty()) {
        auto socket = std::make_shared<asio::posix::stream_descriptor>(
            executor_, started->stdin_socket.release());
        tasks_.spawn(feed_stdin(std::move(socket), std::move(stdin_data)));
    }
    co_return exec_stream(std::move(started->stream));
}

asio::awaitable<result<process>> local_backend::spawn(std::string id, exec_request request) {
    if (!request.stdin_data.empty()) {
        co_return make_error(errc::invalid_argument,
                             "spawn keeps stdin open: write it with process::async_write_stdin "
                             "instead of exec_request::stdin_data");
    }
    const auto ceiling = exec_request::max_spawn_wall_limit;
    // A resident is a sandbox service: its own cgroup, and it outlives this connection.
    const std::uint32_t flags =
        request.resident ? wire::exec_resident | wire::exec_own_cgroup : wire::exec_none;
    auto started = co_await start_command(std::move(id), std::move(request), ceiling, flags);
    if (!started) co_return std::move(started).error();
    auto handle = std::make_unique<local_process>(
        executor_, std::move(started->stream), std::move(started->stdin_socket),
        std::move(started->agent), started->exec_id, started->pid);
    co_return process(std::move(handle));
}

asio::awaitable<result<terminal>> local_backend::async_open_terminal(std::string id,
                                                                     exec_request request,
                                                                     terminal_size size) {
    return guarded(open_terminal(std::move(id), std::move(request), size));
}

asio::awaitable<result<terminal>> local_backend::async_attach_terminal(std::string id, int pid) {
    return guarded(attach_terminal(std::move(id), pid));
}

asio::awaitable<result<terminal>> local_backend::open_terminal(std::string id, exec_request request,
                                                               terminal_size size) {
    if (!valid_terminal_size(size)) {
        co_return make_error(errc::invalid_argument,
                             "a terminal has 1-1000 rows and columns, not " +
                                 std::to_string(size.rows) + "x" + std::to_string(size.cols));
    }
    if (!request.stdin_data.empty()) {
        co_return make_error(errc::invalid_argument,
                             "a terminal's input is written with terminal::async_write instead of "
                             "exec_request::stdin_data");
    }
    // What the command leaves behind when it ends dies with it, as a terminal's session hangs up.
    std::uint32_t flags = wire::exec_terminal | wire::exec_own_cgroup;
    if (request.resident) flags |= wire::exec_resident;
    const wire::terminal_size wire_size{size.rows, size.cols};
    auto started = co_await start_command(std::move(id), std::move(request),
                                          exec_request::max_spawn_wall_limit, flags, wire_size);
    if (!started) co_return std::move(started).error();
    auto handle = std::make_unique<local_terminal>(
        executor_, std::move(started->stream), std::move(started->master),
        std::move(started->agent), started->exec_id, started->pid);
    co_return terminal(std::move(handle));
}

asio::awaitable<result<terminal>> local_backend::attach_terminal(std::string id, int pid) {
    auto found = find(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    if (sandbox->gone_reason)
        co_return make_error(errc::sandbox_unavailable, *sandbox->gone_reason);
    if (!sandbox->agent) co_return make_error(errc::sandbox_unavailable, "the sandbox has ended");
    auto ended = make_ended_stdio();
    if (!ended) co_return std::move(ended).error();
    const std::uint64_t exec_id = next_exec_id_++;
    const auto limit = deadline::after(start_timeout);
    auto attached = co_await sandbox->agent->async_attach_terminal(exec_id, pid, limit);
    if (!attached) co_return std::move(attached).error();
    unique_fd output(::fcntl(attached->master.get(), F_DUPFD_CLOEXEC, 0));
    if (!output.is_open()) {
        sandbox->agent->release(exec_id);
        co_return stdio_error("dup");
    }
    local_command command;
    command.agent = sandbox->agent;
    command.exec_id = exec_id;
    command.state = std::move(attached->state);
    command.program = "the terminal of pid " + std::to_string(pid);
    command.oom = sandbox->oom;
    command.kill_grace = options_.kill_grace;
    command.backstop = deadline::after(exec_request::max_spawn_wall_limit + wall_limit_slack);
    command.resident = true;  // a reattachment never ends the command when it is dropped
    auto stream = std::make_unique<local_exec_stream>(
        executor_, std::move(command), std::move(output), std::move(ended->err_ours));
    auto handle = std::make_unique<local_terminal>(
        executor_, std::move(stream), std::move(attached->master), sandbox->agent, exec_id, pid);
    co_return terminal(std::move(handle));
}

asio::awaitable<result<local_backend::started_command>> local_backend::start_command(
    std::string id, exec_request request, std::chrono::milliseconds ceiling,
    std::uint32_t exec_flags, wire::terminal_size size) {
    const bool on_terminal = (exec_flags & wire::exec_terminal) != 0;
    auto found = find(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    if (sandbox->gone_reason)
        co_return make_error(errc::sandbox_unavailable, *sandbox->gone_reason);
    if (auto invalid = validate_exec(request, ceiling); !invalid)
        co_return std::move(invalid).error();

    std::vector<std::string> argv = std::move(request.argv);
    if (argv.empty()) argv = {"/bin/sh", "-c", request.shell};
    std::map<std::string, std::string> env = base_environment(sandbox->record.layout);
    if (request.as_root) {
        env["HOME"] = "/root";  // root's home (a tmpfs of its own), as in its passwd entry
        exec_flags |= wire::exec_as_root;
    }
    for (const auto& [k, v] : sandbox->record.env) env[k] = v;
    for (const auto& [k, v] : request.env) env[k] = v;
    // As E2B's SDKs start a terminal: a capable terminal type unless the caller names one.
    if (on_terminal) env.try_emplace("TERM", "xterm-256color");
    // Forced: the sandbox's code cannot point them elsewhere (there is nowhere else anyway).
    for (auto& [k, v] :
         egress::proxy_environment(sandbox->record.network.mode, sandbox_network::proxy_port))
        env[k] = std::move(v);
    std::vector<std::string> env_list;
    for (const auto& [k, v] : env) env_list.push_back(k + "=" + v);
    const std::string cwd = request.cwd.empty() ? sandbox->record.layout.workdir : request.cwd;

    const std::uint64_t exec_id = next_exec_id_++;
    std::vector<std::byte> record;
    if (!wire::encode_exec(exec_id, static_cast<std::uint64_t>(request.wall_limit.count()), argv,
                           env_list, cwd, record, exec_flags, size)) {
        co_return make_error(errc::invalid_argument,
                             "command, environment and cwd exceed " +
                                 std::to_string(wire::max_message_bytes / 1024) + " KiB");
    }

    auto stdio = on_terminal ? make_ended_stdio() : make_stdio();
    if (!stdio) co_return std::move(stdio).error();
    auto& pipes = *stdio;
    local_command command;
    command.agent = sandbox->agent;
    command.exec_id = exec_id;
    command.program = argv.front();
    command.oom = sandbox->oom;
    command.kill_grace = options_.kill_grace;
    command.backstop = deadline::after(request.wall_limit + wall_limit_slack);
    command.resident = request.resident;

    const int child_ends[3] = {pipes.stdin_theirs.get(), pipes.out_theirs.get(),
                               pipes.err_theirs.get()};
    std::span<const int> stdio_sent = child_ends;
    if (on_terminal) stdio_sent = {};
    const auto start_limit = deadline::after(start_timeout);
    auto state = co_await sandbox->agent->async_exec(exec_id, record, stdio_sent, start_limit);
    pipes.stdin_theirs.reset();
    pipes.out_theirs.reset();
    pipes.err_theirs.reset();
    if (!state) {
        // A send that failed because pid 1 is gone (destroyed by another process, TTL) says
        // so, even before the helper's report arrives.
        if (sandbox->pidfd.is_open() && has_exited(sandbox->pidfd.get())) {
            co_return make_error(errc::sandbox_unavailable, "the sandbox's pid 1 exited");
        }
        co_return std::move(state).error();
    }
    command.state = *state;

    started_command started;
    started.agent = sandbox->agent;
    started.exec_id = exec_id;
    started.stdin_socket = std::move(pipes.stdin_ours);
    // The stream owns the command from here: dropping it (cancellation included) kills it.
    started.stream = std::make_unique<local_exec_stream>(
        executor_, std::move(command), std::move(pipes.out_ours), std::move(pipes.err_ours));
    // The record is sent: the command runs whatever the caller does. A cancellation already
    // pending would make the wait below throw (and drop the stream unconfirmed), so it is
    // taken here, and one that races the start is honoured too.
    std::optional<async_event::wait_outcome> outcome;
    if (!is_cancelled(co_await asio::this_coro::cancellation_state)) {
        outcome = co_await (*state)->started.async_wait(start_limit);
    }
    const bool raced = is_cancelled(co_await asio::this_coro::cancellation_state);
    if (raced) co_await asio::this_coro::reset_cancellation_state();
    if (!outcome || *outcome == async_event::wait_outcome::cancelled || raced) {
        // As exec_stream's own cancellation: kill, then wait (not cancellably, bounded by the
        // kill grace) for the agent to confirm the end before completing.
        if (!(*state)->exit) (void)sandbox->agent->kill(exec_id, SIGKILL);
        const auto grace = deadline::after(options_.kill_grace);
        co_await (*state)->exited.async_wait(grace);
        if (!(*state)->exit) {
            co_return make_error(errc::backend_failure,
                                 "exec was cancelled as the command started, and its end was "
                                 "not confirmed within " +
                                     std::to_string(options_.kill_grace.count()) + " ms");
        }
        co_return make_error(errc::cancelled, "exec was cancelled before the command started");
    }
    if (!(*state)->start && !(*state)->exit) {
        if (auto broken = sandbox->agent->broken()) {
            co_return make_error(errc::sandbox_unavailable, *broken);
        }
        co_return make_error(errc::backend_failure, "the sandbox agent did not start the command");
    }
    if ((*state)->start) started.pid = (*state)->start->pid;
    if ((*state)->master.is_open()) {
        unique_fd output(::fcntl((*state)->master.get(), F_DUPFD_CLOEXEC, 0));
        if (!output.is_open()) co_return stdio_error("dup");  // the stream kills the command
        ::fcntl(output.get(), F_SETFL, O_NONBLOCK);  // the master's, shared by both duplicates
        started.stream->replace_output(std::move(output));
        started.master = std::move((*state)->master);
    } else if ((*state)->master_lost) {
        co_return make_error(errc::limit_exceeded,
                             "the application is out of file descriptors (RLIMIT_NOFILE) for "
                             "the terminal");
    }
    co_return started;
}

error local_backend::stdio_error(const char* call) {
    const int err = errno;
    if (err == EMFILE || err == ENFILE) {
        return make_error(errc::limit_exceeded,
                          "the application is out of file descriptors (RLIMIT_NOFILE): each "
                          "running command needs 3");
    }
    return make_error(errc::backend_failure, std::string(call) + ": " + std::strerror(err));
}

result<local_backend::stdio_set> local_backend::make_stdio() {
    stdio_set s;
    int pair[2];
    // stdin is a socket so that writing to an exited program is EPIPE (MSG_NOSIGNAL), never
    // SIGPIPE in the application.
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        return stdio_error("socketpair");
    }
    s.stdin_ours.reset(pair[0]);
    s.stdin_theirs.reset(pair[1]);
    ::shutdown(pair[1], SHUT_WR);
    if (::pipe2(pair, O_CLOEXEC) != 0) return stdio_error("pipe");
    s.out_ours.reset(pair[0]);
    s.out_theirs.reset(pair[1]);
    if (::pipe2(pair, O_CLOEXEC) != 0) return stdio_error("pipe");
    s.err_ours.reset(pair[0]);
    s.err_theirs.reset(pair[1]);
    ::fcntl(s.out_ours.get(), F_SETPIPE_SZ, 256 * 1024);
    ::fcntl(s.out_ours.get(), F_SETFL, O_NONBLOCK);
    ::fcntl(s.err_ours.get(), F_SETFL, O_NONBLOCK);
    ::fcntl(s.stdin_ours.get(), F_SETFL, O_NONBLOCK);
    return s;
}

result<local_backend::stdio_set> local_backend::make_ended_stdio() {
    stdio_set s;
    int pair[2];
    for (unique_fd* ours : {&s.out_ours, &s.err_ours}) {
        if (::pipe2(pair, O_CLOEXEC | O_NONBLOCK) != 0) return stdio_error("pipe");
        ours->reset(pair[0]);
        ::close(pair[1]);
    }
    return s;
}

std::map<std::string, std::string> local_backend::base_environment(const sandbox_layout& layout) {
    // The sandbox's Python environment comes first: python, python3 and pip are its (one
    // interpreter that sees what pip installed). The template's command aliases come last: a
    // host's own python wins over them wherever it is.
    const std::string path =
        std::string(wire::python_env_dir) +
        "/bin:/usr/local/bin:/usr/bin:/bin:" + std::string(wire::command_alias_dir);
    return {{"PATH", path}, {"HOME", layout.home}, {"LANG", "C.UTF-8"}};
}

}  // namespace moat
