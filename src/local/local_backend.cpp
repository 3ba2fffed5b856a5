#include <moat/local_backend.hpp>
#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"
#include "core/cancellation.hpp"
#include "core/descriptor_wait.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"
#include "local/cgroup_stats.hpp"
#include "local/helper_client.hpp"
#include "local/local_exec_stream.hpp"
#include "local/sandbox_files.hpp"
#include "local/sandbox_id.hpp"
#include "local/spec_validation.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>

namespace moat {
namespace {

constexpr auto helper_start_timeout = std::chrono::seconds(10);
constexpr auto create_timeout = std::chrono::seconds(30);
constexpr auto ready_timeout = std::chrono::seconds(10);
constexpr auto start_timeout = std::chrono::seconds(10);
// How long the agent may take to confirm a control request (a TTL change).
constexpr auto control_timeout = std::chrono::seconds(5);
// How long past its wall limit a command may run before moat concludes the agent failed to kill it.
constexpr auto wall_limit_slack = std::chrono::seconds(5);

struct local_sandbox {
    explicit local_sandbox(const asio::any_io_executor& ex) : answered(ex), reaped(ex) {}
    sandbox_info info;
    std::shared_ptr<agent_channel> agent;
    unique_fd pidfd;
    unique_fd root;              // O_PATH of its "/" (/proc/<pid>/root), for host-side file access
    std::uint32_t uid_base = 0;  // host uid (and gid) of sandbox uid 0
    std::string memory_cgroup;
    std::map<std::string, std::string> env;
    std::string workdir;
    async_event answered;   // the helper reported on this sandbox (reaped, or never knew it)
    async_event reaped;     // pid 1 is confirmed gone
    int cleanup_errno = 0;  // from the helper's reaped report (ESRCH: it did not know the sandbox)
    std::optional<std::string> gone_reason;
};

std::vector<std::string> layer_names(std::uint32_t bits) {
    static constexpr std::pair<std::uint32_t, const char*> names[] = {
        {wire::layer_user_ns, "user_ns"},
        {wire::layer_pid_ns, "pid_ns"},
        {wire::layer_mount_ns, "mount_ns"},
        {wire::layer_net_ns, "net_ns"},
        {wire::layer_ipc_ns, "ipc_ns"},
        {wire::layer_uts_ns, "uts_ns"},
        {wire::layer_cgroup_ns, "cgroup_ns"},
        {wire::layer_seccomp, "seccomp"},
        {wire::layer_cgroup_memory, "cgroup_memory"},
        {wire::layer_cgroup_pids, "cgroup_pids"},
        {wire::layer_cgroup_cpu, "cgroup_cpu"},
        {wire::layer_no_new_privs, "no_new_privs"},
    };
    std::vector<std::string> out;
    for (const auto& [bit, name] : names) {
        if ((bits & bit) != 0) out.emplace_back(name);
    }
    return out;
}

std::string default_state_dir() {
    if (::geteuid() == 0) return "/run/moat";
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime == '/') {
        return std::string(runtime) + "/moat";
    }
    return "/tmp/moat-" + std::to_string(::geteuid());
}

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

class local_backend final : public backend {
  public:
    local_backend(asio::any_io_executor executor, local_options options)
        : executor_(std::move(executor)),
          options_(std::move(options)),
          tasks_(executor_, "local backend") {
        if (options_.state_dir.empty()) options_.state_dir = default_state_dir();
        helper_ = std::make_shared<helper_client>(executor_, tasks_, options_);
        helper_->on_reaped = [this](const wire::reaped_message& m) { on_reaped(m); };
        helper_->on_helper_lost = [this](const std::string& reason) { on_helper_lost(reason); };
    }

    ~local_backend() override {
        helper_->on_reaped = nullptr;
        helper_->on_helper_lost = nullptr;
        for (auto& [id, sandbox] : sandboxes_) {
            if (sandbox->agent) sandbox->agent->close();
        }
        helper_->shutdown();
        tasks_.cancel_all();
    }

    asio::any_io_executor get_executor() const override { return executor_; }
    std::string name() const override { return "local"; }

    asio::awaitable<result<sandbox_info>> async_create(sandbox_spec spec) override {
        try {
            co_return co_await create(std::move(spec));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<void>> async_destroy(std::string id) override {
        try {
            co_return co_await destroy(std::move(id));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<exec_stream>> async_exec_stream(std::string id,
                                                           exec_request request) override {
        try {
            co_return co_await start_exec(std::move(id), std::move(request));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    // File access runs inline: a few system calls per file, bounded by file_limits. No co_await,
    // so there is nothing to cancel; the boundary only turns bad_alloc into an error.
    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::string id, std::vector<file_write> files) override {
        try {
            auto root = file_root(id);
            if (!root) co_return std::move(root).error();
            const file_limits limits;
            co_return write_files(*root, files, limits);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths) override {
        try {
            auto root = file_root(id);
            if (!root) co_return std::move(root).error();
            const file_limits limits;
            co_return read_files(*root, paths, limits);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<file_stat>> async_stat(std::string id, std::string path) override {
        try {
            auto root = file_root(id);
            if (!root) co_return std::move(root).error();
            co_return stat_path(*root, path);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string id,
                                                                   std::string path) override {
        try {
            auto root = file_root(id);
            if (!root) co_return std::move(root).error();
            const file_limits limits;
            co_return list_dir(*root, path, limits);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

  private:
    asio::awaitable<result<sandbox_info>> create(sandbox_spec spec) {
        if (auto invalid = validate_spec(spec); !invalid) co_return std::move(invalid).error();
        auto started =
            co_await helper_->async_ensure_started(deadline::after(helper_start_timeout));
        if (!started) co_return std::move(started).error();

        const std::string id = make_sandbox_id();
        auto request = wire::make_message<wire::create_message>(wire::message_type::create);
        wire::copy_field(request.sandbox_id, id);
        request.memory_bytes = spec.limits.memory_bytes;
        request.workspace_bytes = effective_workspace_bytes(spec.limits);
        request.tmp_bytes = spec.limits.tmp_bytes;
        request.ttl_ms = static_cast<std::uint64_t>(spec.ttl.count());
        request.pids_max = spec.limits.pids;
        request.cpu_millicores = spec.limits.cpu_millicores;
        request.flags = (spec.best_effort ? wire::create_best_effort : 0u) |
                        (spec.survive_owner ? wire::create_survive_owner : 0u);

        const auto create_limit = deadline::after(create_timeout);
        auto made = co_await helper_->async_create(request, create_limit);
        if (!made) co_return std::move(made).error();

        auto sandbox = std::make_shared<local_sandbox>(executor_);
        const auto now = std::chrono::system_clock::now();
        sandbox->info.id = id;
        sandbox->info.labels = spec.labels;
        sandbox->info.created_at = now;
        sandbox->info.expires_at = now + spec.ttl;
        sandbox->info.host_pid = made->message.host_pid;
        sandbox->info.layers = layer_names(made->message.applied_layers);
        sandbox->info.limits = spec.limits;
        sandbox->info.limits.workspace_bytes = request.workspace_bytes;
        sandbox->pidfd = std::move(made->pidfd);
        sandbox->uid_base = made->message.uid_base;
        sandbox->memory_cgroup = std::string(wire::read_field(made->message.memory_cgroup));
        sandbox->env = std::move(spec.env);
        sandbox->workdir = std::move(spec.workdir);
        sandbox->agent = std::make_shared<agent_channel>(executor_, std::move(made->control), id);
        sandbox->agent->start(tasks_);
        sandboxes_[id] = sandbox;

        auto ready = co_await sandbox->agent->async_wait_ready(deadline::after(ready_timeout));
        if (ready) {
            auto root = open_sandbox_root(made->message.host_pid, sandbox->pidfd.get());
            if (root) {
                sandbox->root = std::move(*root);
            } else {
                ready = std::move(root).error();
            }
        }
        if (ready && is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            ready = make_error(errc::cancelled, "create was cancelled");
        }
        if (!ready) {
            // Cleanup is not cancellable: a half-made sandbox is destroyed before we return.
            co_await asio::this_coro::reset_cancellation_state();
            auto destroyed = co_await async_destroy(id);
            if (!destroyed)
                detail::log(log_level::error, "local", destroyed.error().to_string(), id);
            co_return std::move(ready).error();
        }
        detail::log(log_level::debug, "local", "created", id);
        co_return sandbox->info;
    }

  public:
    asio::awaitable<result<sandbox_info>> async_attach(std::string) override {
        co_return make_error(errc::not_supported,
                             "local backend does not implement attach yet (persistent sandboxes)");
    }

    asio::awaitable<result<sandbox_info>> async_inspect(std::string id) override {
        auto sandbox = find(id);
        if (!sandbox) co_return std::move(sandbox).error();
        co_return (*sandbox)->info;
    }

    asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) override {
        std::vector<sandbox_info> out;
        for (const auto& [id, sandbox] : sandboxes_) {
            bool matches = true;
            for (const auto& [key, value] : filter) {
                auto it = sandbox->info.labels.find(key);
                matches = matches && it != sandbox->info.labels.end() && it->second == value;
            }
            if (matches) out.push_back(sandbox->info);
        }
        co_return out;
    }

    asio::awaitable<result<sandbox_info>> async_extend_ttl(std::string id,
                                                           std::chrono::milliseconds ttl) override {
        try {
            co_return co_await extend_ttl(std::move(id), ttl);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

  private:
    asio::awaitable<result<sandbox_info>> extend_ttl(std::string id,
                                                     std::chrono::milliseconds ttl) {
        if (auto invalid = validate_ttl(ttl); !invalid) co_return std::move(invalid).error();
        auto found = find(id);
        if (!found) co_return std::move(found).error();
        auto sandbox = *found;
        if (sandbox->gone_reason || !sandbox->agent) {
            co_return make_error(errc::sandbox_unavailable,
                                 sandbox->gone_reason.value_or("the sandbox has ended"));
        }
        auto agent = sandbox->agent;  // the sandbox may end while we wait
        const auto limit = deadline::after(control_timeout);
        auto set = co_await agent->async_set_ttl(ttl, limit);
        const auto requested = std::chrono::system_clock::now() + ttl;
        if (!set) {
            // Sent but unconfirmed: plan for the earlier of the two ends.
            if (set.error().code == errc::backend_failure) {
                sandbox->info.expires_at = std::min(sandbox->info.expires_at, requested);
            }
            co_return std::move(set).error();
        }
        sandbox->info.expires_at = requested;
        co_return sandbox->info;
    }

    asio::awaitable<result<void>> destroy(std::string id) {
        auto found = find(id);
        if (!found) co_return std::move(found).error();
        auto sandbox = *found;
        const auto limit = deadline::after(options_.destroy_timeout);
        if (!sandbox->reaped.is_set()) {
            if (sandbox->agent) sandbox->agent->close();
            auto asked = co_await helper_->async_destroy(id, limit);
            // Not cancellable: wait for the confirmation until the bound, whatever the caller does.
            while (asked && !sandbox->answered.is_set() && !limit.has_expired()) {
                co_await sandbox->answered.async_wait(limit);
            }
            // The helper is gone, or it did not know this sandbox (it was started after a helper
            // that died): confirm through our own pidfd.
            if (!asked || sandbox->cleanup_errno == ESRCH)
                co_await kill_without_helper(*sandbox, limit);
        }
        if (!sandbox->reaped.is_set()) {
            co_return make_error(errc::backend_failure,
                                 "destroy of " + id + " was not confirmed within " +
                                     std::to_string(options_.destroy_timeout.count()) + " ms");
        }
        sandbox->root.reset();
        sandboxes_.erase(id);
        if (sandbox->cleanup_errno != 0 && sandbox->cleanup_errno != ESRCH) {
            co_return make_error(errc::backend_failure,
                                 "sandbox " + id + " is gone but its cgroups were not removed: " +
                                     std::strerror(sandbox->cleanup_errno));
        }
        detail::log(log_level::debug, "local", "destroyed", id);
        co_return result<void>{};
    }

    asio::awaitable<result<exec_stream>> start_exec(std::string id, exec_request request) {
        auto found = find(id);
        if (!found) co_return std::move(found).error();
        auto sandbox = *found;
        if (sandbox->gone_reason)
            co_return make_error(errc::sandbox_unavailable, *sandbox->gone_reason);
        if (auto invalid = validate_exec(request); !invalid) co_return std::move(invalid).error();

        std::vector<std::string> argv = std::move(request.argv);
        if (argv.empty()) argv = {"/bin/sh", "-c", request.shell};
        std::map<std::string, std::string> env = base_environment();
        for (const auto& [k, v] : sandbox->env) env[k] = v;
        for (const auto& [k, v] : request.env) env[k] = v;
        std::vector<std::string> env_list;
        for (const auto& [k, v] : env) env_list.push_back(k + "=" + v);
        const std::string cwd = request.cwd.empty() ? sandbox->workdir : request.cwd;

        const std::uint64_t exec_id = next_exec_id_++;
        std::vector<std::byte> record;
        if (!wire::encode_exec(exec_id, static_cast<std::uint64_t>(request.wall_limit.count()),
                               argv, env_list, cwd, record)) {
            co_return make_error(errc::invalid_argument,
                                 "command, environment and cwd exceed " +
                                     std::to_string(wire::max_message_bytes / 1024) + " KiB");
        }

        auto stdio = make_stdio();
        if (!stdio) co_return std::move(stdio).error();
        auto& pipes = *stdio;
        local_command command;
        command.agent = sandbox->agent;
        command.exec_id = exec_id;
        command.program = argv.front();
        command.memory_cgroup = sandbox->memory_cgroup;
        command.oom_kills_before = read_oom_kill_count(sandbox->memory_cgroup);
        command.kill_grace = options_.kill_grace;
        command.backstop = deadline::after(request.wall_limit + wall_limit_slack);

        const int child_ends[3] = {pipes.stdin_theirs.get(), pipes.out_theirs.get(),
                                   pipes.err_theirs.get()};
        const auto start_limit = deadline::after(start_timeout);
        auto state = co_await sandbox->agent->async_exec(exec_id, record, child_ends, start_limit);
        pipes.stdin_theirs.reset();
        pipes.out_theirs.reset();
        pipes.err_theirs.reset();
        if (!state) co_return std::move(state).error();
        command.state = *state;

        if (!request.stdin_data.empty()) {
            auto socket = std::make_shared<asio::posix::stream_descriptor>(
                executor_, pipes.stdin_ours.release());
            tasks_.spawn(feed_stdin(std::move(socket), std::move(request.stdin_data)));
        }
        pipes.stdin_ours.reset();

        // The stream owns the command from here: dropping it (cancellation included) kills it.
        auto stream = std::make_unique<local_exec_stream>(
            executor_, std::move(command), std::move(pipes.out_ours), std::move(pipes.err_ours));
        const auto outcome = co_await (*state)->started.async_wait(start_limit);
        // A cancellation that raced the start is honoured too, so the caller's next co_await does
        // not throw with the command still running.
        const bool raced = is_cancelled(co_await asio::this_coro::cancellation_state);
        if (raced) co_await asio::this_coro::reset_cancellation_state();
        if (outcome == async_event::wait_outcome::cancelled || raced) {
            stream.reset();  // kills it
            co_return make_error(errc::cancelled, "exec was cancelled before the command started");
        }
        if (!(*state)->start && !(*state)->exit) {
            if (auto broken = sandbox->agent->broken()) {
                co_return make_error(errc::sandbox_unavailable, *broken);
            }
            co_return make_error(errc::backend_failure,
                                 "the sandbox agent did not start the command");
        }
        co_return exec_stream(std::move(stream));
    }

  private:
    struct stdio_set {
        unique_fd stdin_ours, stdin_theirs, out_ours, out_theirs, err_ours, err_theirs;
    };

    // Out of descriptors is a capacity limit (the caller may retry later), not a broken backend.
    static error stdio_error(const char* call) {
        const int err = errno;
        if (err == EMFILE || err == ENFILE) {
            return make_error(errc::limit_exceeded,
                              "the application is out of file descriptors (RLIMIT_NOFILE): each "
                              "running command needs 3");
        }
        return make_error(errc::backend_failure, std::string(call) + ": " + std::strerror(err));
    }

    static result<stdio_set> make_stdio() {
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

    static std::map<std::string, std::string> base_environment() {
        return {
            {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/workspace"}, {"LANG", "C.UTF-8"}};
    }

    result<std::shared_ptr<local_sandbox>> find(const std::string& id) {
        auto it = sandboxes_.find(id);
        if (it == sandboxes_.end()) {
            return make_error(errc::sandbox_not_found, "no sandbox with id '" + id + "'");
        }
        return it->second;
    }

    // What the file functions need, once the sandbox is known to be alive.
    result<sandbox_root> file_root(const std::string& id) {
        auto found = find(id);
        if (!found) return std::move(found).error();
        const local_sandbox& sandbox = **found;
        if (sandbox.gone_reason) return make_error(errc::sandbox_unavailable, *sandbox.gone_reason);
        if (sandbox.agent && sandbox.agent->broken())
            return make_error(errc::sandbox_unavailable, *sandbox.agent->broken());
        if (!sandbox.root.is_open())
            return make_error(errc::sandbox_unavailable, "sandbox " + id + " is not ready yet");
        // The helper's `reaped` report may still be on its way.
        if (!sandbox.pidfd.is_open() || has_exited(sandbox.pidfd.get()))
            return make_error(errc::sandbox_unavailable, "the sandbox's pid 1 exited");
        return sandbox_root{sandbox.root.get(), sandbox.uid_base + wire::sandbox_user_id,
                            sandbox.uid_base + wire::sandbox_group_id};
    }

    // The helper cannot confirm (it is gone, or never knew this sandbox): kill pid 1 through our
    // own pidfd and wait for it to report the exit. The kernel ends every process of the pid
    // namespace before pid 1 can exit.
    asio::awaitable<void> kill_without_helper(local_sandbox& sandbox, deadline limit) {
        if (!sandbox.pidfd.is_open()) co_return;
        ::syscall(SYS_pidfd_send_signal, sandbox.pidfd.get(), SIGKILL, nullptr, 0);
        asio::posix::stream_descriptor pidfd(executor_, sandbox.pidfd.get());
        const auto waited =
            co_await async_wait_until(pidfd, asio::posix::descriptor_base::wait_read, limit);
        pidfd.release();  // still owned by `sandbox`
        if (waited == wait_result::ready) sandbox.reaped.set();
    }

    void on_reaped(const wire::reaped_message& m) {
        auto it = sandboxes_.find(std::string(wire::read_field(m.sandbox_id)));
        if (it == sandboxes_.end()) return;
        auto& sandbox = *it->second;
        sandbox.cleanup_errno = m.cleanup_errno;
        sandbox.answered.set();
        if (m.cleanup_errno == ESRCH) return;  // async_destroy confirms through the pidfd
        sandbox.info.state = sandbox_state::exited;
        if (!sandbox.gone_reason) sandbox.gone_reason = "the sandbox's pid 1 exited";
        // Keep only the record (inspect says `exited`) until destroy releases it.
        if (sandbox.agent) sandbox.agent->close();
        sandbox.agent.reset();
        sandbox.pidfd.reset();
        sandbox.root.reset();  // it pins the sandbox's mounts (its tmpfs memory)
        sandbox.reaped.set();
    }

    void on_helper_lost(const std::string& reason) {
        for (auto& [id, sandbox] : sandboxes_) {
            if (!sandbox->gone_reason) sandbox->gone_reason = reason;
            sandbox->info.state = sandbox_state::exited;
            if (sandbox->agent) sandbox->agent->close();
            sandbox->root.reset();
            // Its sandboxes die with it (PDEATHSIG); destroy confirms that through the pidfd.
            sandbox->cleanup_errno = ESRCH;
            sandbox->answered.set();
        }
    }

    asio::any_io_executor executor_;
    local_options options_;
    task_group tasks_;
    std::shared_ptr<helper_client> helper_;
    std::map<std::string, std::shared_ptr<local_sandbox>> sandboxes_;
    std::uint64_t next_exec_id_ = 1;
};

}  // namespace

std::unique_ptr<backend> make_local_backend(asio::any_io_executor executor, local_options options) {
    return std::make_unique<local_backend>(std::move(executor), std::move(options));
}

}  // namespace moat
