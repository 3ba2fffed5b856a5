#include <moat/local_backend.hpp>
#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"
#include "core/blocking_job.hpp"
#include "core/cancellation.hpp"
#include "core/descriptor_wait.hpp"
#include "core/exception_boundary.hpp"
#include "egress/egress_proxy.hpp"
#include "egress/network_policy.hpp"
#include "local/agent_channel.hpp"
#include "local/cgroup_stats.hpp"
#include "local/helper_client.hpp"
#include "local/janitor_rules.hpp"
#include "local/local_exec_stream.hpp"
#include "local/local_process.hpp"
#include "local/sandbox_files.hpp"
#include "local/sandbox_id.hpp"
#include "local/sandbox_records.hpp"
#include "local/spec_validation.hpp"
#include "wire/state_layout.hpp"

#include <asio/basic_socket_acceptor.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <optional>
#include <set>

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
// How long an attach may take: connect, the agent's `ready`.
constexpr auto attach_timeout = std::chrono::seconds(5);
// The name of the sandbox user (uid 1000) in the template root's /etc/passwd.
constexpr const char* default_user = "user";

// The library's copy of a sandbox's egress listener (a TCP socket listening at 127.0.0.1 in the
// sandbox's network namespace, handed over by its agent): accepted on here, from the host's side.
using egress_acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;

// How long the accept loop waits after an accept error other than its own close (EMFILE, ...)
// before it tries again.
constexpr auto egress_accept_retry = std::chrono::milliseconds(100);

// One destroy of one sandbox, shared by every caller that asks while it runs.
struct destroy_flight {
    explicit destroy_flight(const asio::any_io_executor& ex) : done(ex) {}
    async_event done;
    std::optional<result<void>> outcome;
};

struct local_sandbox {
    explicit local_sandbox(const asio::any_io_executor& ex) : answered(ex), reaped(ex) {}
    sandbox_info info;
    std::shared_ptr<agent_channel> agent;
    unique_fd pidfd;
    unique_fd root;         // O_PATH of its "/" (/proc/<pid>/root), for host-side file access
    sandbox_record record;  // as written to the state directory: uid base, cgroups, env, layout
    async_event answered;   // the helper reported on this sandbox (reaped, or never knew it)
    async_event reaped;     // pid 1 is confirmed gone
    int cleanup_errno = 0;  // from the helper's reaped report (ESRCH: it did not know the sandbox)
    std::optional<std::string> gone_reason;
    std::shared_ptr<oom_watch> oom = std::make_shared<oom_watch>();
    std::shared_ptr<destroy_flight> destroying;  // set while a destroy runs
    std::shared_ptr<egress_acceptor> egress;     // its egress listener, if its network is not none
};

// Accepts on a sandbox's egress listener until it is closed, handing every connection to the
// proxy. Holds the proxy and the acceptor, so it never outlives either.
asio::awaitable<void> serve_egress(std::shared_ptr<egress_acceptor> acceptor,
                                   std::shared_ptr<egress::egress_proxy> proxy, std::string id) {
    constexpr auto use_tuple = as_tuple(asio::use_awaitable);
    asio::steady_timer retry(acceptor->get_executor());
    for (;;) {
        auto [ec, socket] = co_await acceptor->async_accept(use_tuple);
        if (!acceptor->is_open() || ec == asio::error::operation_aborted) co_return;
        if (ec) {
            detail::log(log_level::warning, "egress",
                        "accepting a proxy connection: " + ec.message(), id);
            retry.expires_after(egress_accept_retry);
            auto [waited] = co_await retry.async_wait(use_tuple);
            if (waited) co_return;
            continue;
        }
        proxy->serve(id, std::move(socket));
    }
}

// egress_event -> moat's log (component "egress", info): the destination and the decision, never
// request content.
void log_egress_event(const egress::egress_event& e) {
    std::string text = std::string(egress::to_string(e.outcome)) + " " +
                       (e.host.empty() ? std::string("(no host)") : e.host) + ":" +
                       std::to_string(e.port);
    if (e.outcome == egress::egress_outcome::refused) {
        text += " (" + std::to_string(e.status) + " " + e.reason + ")";
    } else if (e.outcome == egress::egress_outcome::closed) {
        text += " (" + e.reason + ", " + std::to_string(e.bytes_out) + " bytes out, " +
                std::to_string(e.bytes_in) + " in)";
    }
    detail::log(log_level::info, "egress", text, e.sandbox_id);
}

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
        {wire::layer_command_cgroups, "command_cgroups"},
    };
    std::vector<std::string> out;
    for (const auto& [bit, name] : names) {
        if ((bits & bit) != 0) out.emplace_back(name);
    }
    return out;
}

std::string default_owner_instance() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    // Two backends of one process must differ. One getrandom call, no loop; if it fails, the
    // time and a process-wide counter tell them apart, and the failure is logged.
    static std::atomic<std::uint32_t> instances{0};
    std::uint32_t random = 0;
    if (::getrandom(&random, sizeof random, GRND_NONBLOCK) != sizeof random) {
        const int err = errno;
        const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        random = static_cast<std::uint32_t>(now) * 2654435761u + ++instances;
        const char* name = ::strerrorname_np(err);
        detail::log(log_level::error, "local",
                    std::string("getrandom failed (") + (name != nullptr ? name : "E?") +
                        "): the owner instance suffix comes from the clock and a counter");
    }
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%06x", random & 0xffffffu);
    return std::string(host) + "/" + std::to_string(::getpid()) + "/" + suffix;
}

// Current cgroup usage: read by list() only (the inventory), never on per-operation paths.
void add_usage(sandbox_info& info, const sandbox_record& r) {
    info.memory_used_bytes.reset();
    info.pids_current.reset();
    if (info.state != sandbox_state::running) return;
    info.memory_used_bytes = read_memory_used(r.cgroups);
    info.pids_current = read_cgroup_number(r.cgroups, "pids.current");
}

// What a record says of its sandbox, without looking at the process (state running).
sandbox_info describe(const sandbox_record& r) {
    sandbox_info info;
    info.id = r.id;
    info.labels = r.labels;
    info.created_at = r.created_at;
    info.expires_at = r.expires_at;
    if (r.init_pid > 0) info.host_pid = r.init_pid;
    info.layers = r.layers;
    info.limits = r.limits;
    info.layout = r.layout;
    info.network = r.network;
    info.owner_instance = r.owner_instance;
    info.survive_owner = r.survive_owner;
    info.owned = false;
    return info;
}

// A recorded sandbox another process holds: its state checked through a pidfd.
sandbox_info info_from_record(const sandbox_record& r) {
    sandbox_info info = describe(r);
    info.state = open_live_init(r) ? sandbox_state::running : sandbox_state::exited;
    return info;
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

// A sandbox's root descriptor of its own, duplicated on the executor before a file job starts, so
// that the backend closing the sandbox's (at its end) can never leave a job with a number that
// names another directory.
struct pinned_root {
    unique_fd fd;
    uid_t uid = 0;
    gid_t gid = 0;
    sandbox_root view() const { return sandbox_root{fd.get(), uid, gid}; }
};

error cancelled_error(const std::string& what) {
    return make_error(errc::cancelled, what + " was cancelled by the caller");
}

// A streamed read: each pull is one read() on the backend's file threads.
class local_read_stream final : public file_read_stream::impl {
  public:
    local_read_stream(asio::thread_pool& pool, std::shared_ptr<stream_reader> reader)
        : pool_(pool), reader_(std::move(reader)) {}

    asio::awaitable<result<std::string>> async_next() override {
        if (finished_) co_return make_error(errc::invalid_argument, "the stream has ended");
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            finished_ = true;
            co_return cancelled_error("reading " + reader_->stat().path);
        }
        std::function<result<std::string>()> work = [reader = reader_] {
            return reader->read(file_stream_chunk_bytes);
        };
        auto job = async_blocking_job<std::string>(pool_, std::move(work));
        auto chunk = co_await std::move(job);
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            finished_ = true;
            co_return cancelled_error("reading " + reader_->stat().path);
        }
        if (!chunk || chunk->empty()) finished_ = true;
        co_return chunk;
    }

  private:
    asio::thread_pool& pool_;
    std::shared_ptr<stream_reader> reader_;
    bool finished_ = false;
};

class local_backend final : public backend {
  public:
    local_backend(asio::any_io_executor executor, local_options options)
        : executor_(std::move(executor)),
          options_(std::move(options)),
          tasks_(executor_, "local backend") {
        if (options_.state_dir.empty()) options_.state_dir = default_state_dir();
        if (options_.owner_instance.empty()) options_.owner_instance = default_owner_instance();
        records_ = sandbox_records(options_.state_dir);
        helper_ = std::make_shared<helper_client>(executor_, tasks_, options_);
        helper_->on_reaped = [this](const wire::reaped_message& m) { on_reaped(m); };
        helper_->on_helper_lost = [this](const std::string& reason) { on_helper_lost(reason); };
    }

    ~local_backend() override {
        // Queued and running file jobs finish (each is one bounded step; an abandoned write's
        // temporary file is removed by its last step).
        if (file_pool_) file_pool_->join();
        helper_->on_reaped = nullptr;
        helper_->on_helper_lost = nullptr;
        for (auto& [id, sandbox] : sandboxes_) {
            stop_egress(*sandbox);
            if (sandbox->agent) sandbox->agent->close();
        }
        // The backend has no asynchronous shutdown: every proxied connection was closed above
        // (close_sandbox), and the proxy's tasks end on their own once the executor runs them.
        egress_.reset();
        helper_->shutdown();
        // The helper killed and reaped what does not survive us; survivors keep their records.
        for (const auto& [id, sandbox] : sandboxes_) {
            if (sandbox->info.owned && !sandbox->info.survive_owner) records_.remove(id);
        }
        tasks_.cancel_all();
    }

    asio::any_io_executor get_executor() const override { return executor_; }
    std::string name() const override { return "local"; }
    std::chrono::milliseconds stop_grace() const override { return options_.kill_grace; }

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

    asio::awaitable<result<process>> async_spawn(std::string id, exec_request request) override {
        try {
            co_return co_await spawn(std::move(id), std::move(request));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<void>> async_signal(std::string id, std::uint64_t process_id,
                                               int signal) override {
        auto found = find(id);
        if (!found) co_return std::move(found).error();
        if ((*found)->gone_reason)
            co_return make_error(errc::sandbox_unavailable, *(*found)->gone_reason);
        if (!(*found)->agent)
            co_return make_error(errc::sandbox_unavailable, "the sandbox has ended");
        if (signal <= 0 || signal >= 65) {
            co_return make_error(errc::invalid_argument,
                                 "signal must be between 1 and 64, got " + std::to_string(signal));
        }
        co_return (*found)->agent->kill(process_id, signal);
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

    asio::awaitable<result<file_write_result>> async_write_file_stream(
        std::string id, file_write_target target, byte_source source) override {
        try {
            co_return co_await write_stream(std::move(id), std::move(target), std::move(source));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string id,
                                                                     std::string path) override {
        try {
            co_return co_await open_read_stream(std::move(id), std::move(path));
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

    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::string id, std::vector<std::string> paths) override {
        try {
            auto root = file_root(id);
            if (!root) co_return std::move(root).error();
            const file_limits limits;
            co_return read_metadata(*root, paths, limits);
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
    // Each step of a streamed write (open, every chunk, the rename or the removal) is one job on
    // the file threads; the source is pulled on the executor between them. The caller's
    // cancellation is looked at before every step (a step itself is not interrupted).
    asio::awaitable<result<file_write_result>> write_stream(std::string id,
                                                            file_write_target target,
                                                            byte_source source) {
        auto pinned = pin_root(id);
        if (!pinned) co_return std::move(pinned).error();
        file_write_result out;
        out.path = target.path;
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return cancelled_error("writing " + target.path);
        }
        std::function<result<std::shared_ptr<stream_writer>>()> open_work =
            [root = *pinned, target]() -> result<std::shared_ptr<stream_writer>> {
            auto opened = stream_writer::open(root->view(), target);
            if (!opened) return std::move(opened).error();
            return std::shared_ptr<stream_writer>(std::move(*opened));
        };
        auto open_job =
            async_blocking_job<std::shared_ptr<stream_writer>>(file_pool(), std::move(open_work));
        auto opened = co_await std::move(open_job);
        if (!opened) {
            out.outcome = std::move(opened).error();
            co_return out;
        }
        std::shared_ptr<stream_writer> writer = std::move(*opened);
        std::function<result<void>()> abandon_work = [writer]() -> result<void> {
            writer->abandon();
            return {};
        };
        std::optional<error> failed;  // the whole call's error
        for (;;) {
            if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
                co_await asio::this_coro::reset_cancellation_state();
                failed = cancelled_error("writing " + target.path);
                break;
            }
            std::exception_ptr thrown;
            result<std::string> chunk = make_error(errc::cancelled, "not pulled");
            try {
                auto pull = source();
                chunk = co_await std::move(pull);
            } catch (...) {
                thrown = std::current_exception();
            }
            if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
                co_await asio::this_coro::reset_cancellation_state();
                failed = cancelled_error("writing " + target.path);
                break;
            }
            if (thrown) chunk = error_from_exception(thrown);
            if (!chunk) {
                out.outcome = error{chunk.error().code,
                                    target.path + ": the source failed: " + chunk.error().detail};
                break;
            }
            if (auto alive = file_root(id); !alive) {
                failed = std::move(alive).error();
                break;
            }
            if (chunk->empty()) {
                std::function<result<void>()> commit_work = [writer] { return writer->commit(); };
                auto commit_job = async_blocking_job<void>(file_pool(), std::move(commit_work));
                out.outcome = co_await std::move(commit_job);
                co_return out;
            }
            auto data = std::make_shared<std::string>(std::move(*chunk));
            std::function<result<void>()> append_work = [writer, data] {
                return writer->append(*data);
            };
            auto append_job = async_blocking_job<void>(file_pool(), std::move(append_work));
            auto appended = co_await std::move(append_job);
            if (!appended) {
                out.outcome = std::move(appended);
                break;
            }
        }
        // Removed before the call completes, so the caller never sees a temporary file left.
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
        }
        auto abandon_job = async_blocking_job<void>(file_pool(), std::move(abandon_work));
        auto abandoned = co_await std::move(abandon_job);
        (void)abandoned;
        if (failed) co_return std::move(*failed);
        co_return out;
    }

    asio::awaitable<result<file_read_stream>> open_read_stream(std::string id, std::string path) {
        auto pinned = pin_root(id);
        if (!pinned) co_return std::move(pinned).error();
        std::function<result<std::shared_ptr<stream_reader>>()> open_work =
            [root = *pinned, path]() -> result<std::shared_ptr<stream_reader>> {
            auto opened = stream_reader::open(root->view(), path);
            if (!opened) return std::move(opened).error();
            return std::shared_ptr<stream_reader>(std::move(*opened));
        };
        auto open_job =
            async_blocking_job<std::shared_ptr<stream_reader>>(file_pool(), std::move(open_work));
        auto opened = co_await std::move(open_job);
        if (!opened) co_return std::move(opened).error();
        file_stat info = (*opened)->stat();
        auto stream = std::make_unique<local_read_stream>(file_pool(), std::move(*opened));
        co_return file_read_stream(std::move(info), std::move(stream));
    }

    asio::thread_pool& file_pool() {
        if (!file_pool_) {
            file_pool_ = std::make_unique<asio::thread_pool>(
                std::max<std::size_t>(options_.file_threads, 1));
        }
        return *file_pool_;
    }

    // file_root() with a descriptor of the job's own.
    result<std::shared_ptr<pinned_root>> pin_root(const std::string& id) {
        auto root = file_root(id);
        if (!root) return std::move(root).error();
        auto pinned = std::make_shared<pinned_root>();
        pinned->fd.reset(::fcntl(root->root_fd, F_DUPFD_CLOEXEC, 0));
        if (!pinned->fd.is_open()) {
            return make_error(errc::limit_exceeded,
                              "the application is out of file descriptors (RLIMIT_NOFILE)");
        }
        pinned->uid = root->uid;
        pinned->gid = root->gid;
        return pinned;
    }

    asio::awaitable<result<sandbox_info>> create(sandbox_spec spec) {
        if (auto invalid = validate_spec(spec); !invalid) co_return std::move(invalid).error();
        auto policy = egress::make_network_policy(spec.network);
        if (!policy) co_return std::move(policy).error();
        sweep_dead_once();
        auto started =
            co_await helper_->async_ensure_started(deadline::after(helper_start_timeout));
        if (!started) co_return std::move(started).error();
        // A host the helper cannot work on (not root, a state directory sandbox uids cannot
        // reach) fails every create with the helper's own reason, before anything is recorded.
        if (auto unusable = helper_->setup_error()) co_return *unusable;

        auto made_id = make_sandbox_id();
        if (!made_id) co_return std::move(made_id).error();
        const std::string id = std::move(*made_id);
        auto request = wire::make_message<wire::create_message>(wire::message_type::create);
        wire::copy_field(request.sandbox_id, id);
        // Every limit is set from here on (unset ones get the defaults); none is ever 0.
        resource_limits limits = spec.limits.with_defaults();
        limits.workspace_bytes = effective_workspace_bytes(limits);
        request.memory_bytes = *limits.memory_bytes;
        request.workspace_bytes = *limits.workspace_bytes;
        request.tmp_bytes = *limits.tmp_bytes;
        request.ttl_ms = static_cast<std::uint64_t>(spec.ttl.count());
        request.pids_max = *limits.pids;
        request.cpu_millicores = *limits.cpu_millicores;
        request.open_files = *limits.open_files;
        if (spec.network.mode != network_mode::none)
            request.egress_port = sandbox_network::proxy_port;
        request.flags = (spec.best_effort ? wire::create_best_effort : 0u) |
                        (spec.survive_owner ? wire::create_survive_owner : 0u);
        wire::copy_field(request.user_name, spec.layout.user);
        wire::copy_field(request.home, spec.layout.home);
        wire::copy_field(request.workdir, spec.layout.workdir);
        wire::copy_field(request.artifacts_dir, spec.layout.artifacts_dir);

        // The record exists before the sandbox does, so a crash at any point leaves something
        // for the janitor to find.
        const auto now = std::chrono::system_clock::now();
        sandbox_record record;
        record.id = id;
        record.labels = spec.labels;
        record.owner_instance = options_.owner_instance;
        record.owner_pid = static_cast<int>(::getpid());
        record.created_at = now;
        record.expires_at = now + spec.ttl;
        record.survive_owner = spec.survive_owner;
        record.env = spec.env;
        record.layout = spec.layout;
        if (record.layout.user.empty()) record.layout.user = default_user;
        record.limits = limits;
        record.network = spec.network;
        if (auto written = records_.write(record); !written) co_return std::move(written).error();

        const auto create_limit = deadline::after(create_timeout);
        auto made = co_await helper_->async_create(request, create_limit);
        if (!made) {
            records_.remove(id);
            co_return std::move(made).error();
        }
        // A cancellation that arrived just as the helper answered: the sandbox exists, so it is
        // registered below and then destroyed like any half-made one. (Left pending, it would make
        // the next co_await throw and leak the sandbox.)
        const bool cancelled_while_made =
            is_cancelled(co_await asio::this_coro::cancellation_state);
        if (cancelled_while_made) co_await asio::this_coro::reset_cancellation_state();
        record.init_pid = made->message.host_pid;
        record.init_start_ticks = made->message.start_time_ticks;
        record.uid_base = made->message.uid_base;
        record.memory_cgroup = std::string(wire::read_field(made->message.memory_cgroup));
        for (const auto* field : {&made->message.memory_cgroup, &made->message.pids_cgroup,
                                  &made->message.cpu_cgroup, &made->message.tracking_cgroup}) {
            const std::string_view dir = wire::read_field(*field);
            if (!dir.empty() && std::find(record.cgroups.begin(), record.cgroups.end(), dir) ==
                                    record.cgroups.end())
                record.cgroups.emplace_back(dir);
        }
        record.layers = layer_names(made->message.applied_layers);

        auto sandbox = std::make_shared<local_sandbox>(executor_);
        sandbox->info = describe(record);
        sandbox->info.owned = true;
        sandbox->pidfd = std::move(made->pidfd);
        sandbox->record = std::move(record);
        // A new memory cgroup has counted no OOM kill yet.
        sandbox->oom->memory_cgroup = sandbox->record.memory_cgroup;
        if (!sandbox->oom->memory_cgroup.empty()) sandbox->oom->seen = 0;
        sandbox->agent = std::make_shared<agent_channel>(executor_, std::move(made->control), id);
        sandbox->agent->start(tasks_);
        sandboxes_[id] = sandbox;

        result<void> ready = make_error(errc::cancelled, "create was cancelled");
        if (!cancelled_while_made) {
            ready = co_await sandbox->agent->async_wait_ready(deadline::after(ready_timeout));
        }
        if (ready) ready = start_egress(*sandbox, *policy);
        if (ready) ready = records_.write(sandbox->record);
        if (ready) ready = open_root(*sandbox);
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
    asio::awaitable<result<sandbox_info>> async_attach(std::string id) override {
        try {
            co_return co_await attach(std::move(id));
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<sandbox_info>> async_inspect(std::string id) override {
        try {
            if (auto it = sandboxes_.find(id); it != sandboxes_.end()) {
                refresh_state(*it->second);
                co_return it->second->info;
            }
            auto record = records_.read(id);
            if (!record) co_return std::move(record).error();
            co_return info_from_record(*record);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<std::vector<janitor_action>>> async_janitor(bool dry_run) override {
        try {
            co_return co_await janitor(dry_run);
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    asio::awaitable<result<host_report>> async_host_report() override {
        try {
            auto started =
                co_await helper_->async_ensure_started(deadline::after(helper_start_timeout));
            if (!started) co_return std::move(started).error();
            host_report report;
            report.layers = layer_names(helper_->host_layers());
            report.detail = helper_->layer_detail();
            report.facts["state_dir"] = options_.state_dir;
            report.facts["owner_instance"] = options_.owner_instance;
            co_return report;
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
    }

    // This backend's sandboxes, then every other one recorded in the state directory.
    asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) override {
        try {
            sweep_dead_once();
            const auto matches = [&filter](const sandbox_info& info) {
                for (const auto& [key, value] : filter) {
                    auto it = info.labels.find(key);
                    if (it == info.labels.end() || it->second != value) return false;
                }
                return true;
            };
            std::vector<sandbox_info> out;
            for (const auto& [id, sandbox] : sandboxes_) {
                refresh_state(*sandbox);
                if (!matches(sandbox->info)) continue;
                out.push_back(sandbox->info);
                add_usage(out.back(), sandbox->record);
            }
            for (const auto& id : records_.ids()) {
                if (sandboxes_.contains(id)) continue;
                // A record that vanished or is corrupt is skipped here; inspect reports it.
                auto record = records_.read(id);
                if (!record) continue;
                auto info = info_from_record(*record);
                if (!matches(info)) continue;
                add_usage(info, *record);
                out.push_back(std::move(info));
            }
            co_return out;
        } catch (...) {
            co_return error_from_exception(std::current_exception());
        }
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
        sandbox->record.expires_at = requested;
        if (auto written = records_.write(sandbox->record); !written) {
            detail::log(log_level::warning, "local", written.error().to_string(), id);
        }
        co_return sandbox->info;
    }

    asio::awaitable<result<void>> destroy(std::string id) {
        const auto limit = deadline::after(options_.destroy_timeout);
        auto it = sandboxes_.find(id);
        if (it == sandboxes_.end()) co_return co_await destroy_recorded(std::move(id), limit);
        auto sandbox = it->second;
        if (sandbox->destroying) {
            // Another destroy of this sandbox runs: share its outcome rather than kill and wait
            // a second time. Not cancellable, like that destroy.
            auto flight = sandbox->destroying;
            while (!flight->done.is_set() && !limit.has_expired()) {
                co_await flight->done.async_wait(limit);
            }
            if (flight->outcome) co_return *flight->outcome;
            co_return unconfirmed_error(id);
        }
        auto flight = std::make_shared<destroy_flight>(executor_);
        sandbox->destroying = flight;
        result<void> outcome = make_error(errc::backend_failure, "destroy of " + id + " failed");
        try {
            outcome = co_await destroy_known(sandbox, id, limit);
        } catch (...) {
            outcome = error_from_exception(std::current_exception());
        }
        // One that did not end the sandbox leaves the next destroy to try again.
        if (sandbox->destroying == flight) sandbox->destroying.reset();
        flight->outcome = outcome;
        flight->done.set();
        co_return outcome;
    }

    error unconfirmed_error(const std::string& id) const {
        return make_error(errc::backend_failure,
                          "destroy of " + id + " was not confirmed within " +
                              std::to_string(options_.destroy_timeout.count()) + " ms");
    }

    asio::awaitable<result<void>> destroy_known(std::shared_ptr<local_sandbox> sandbox,
                                                const std::string& id, deadline limit) {
        // Its proxied connections close at once, whatever the rest of the destroy takes.
        stop_egress(*sandbox);
        if (!sandbox->reaped.is_set()) {
            if (sandbox->agent) sandbox->agent->close();
            if (!sandbox->info.owned) {  // attached: our helper does not know it
                co_await kill_without_helper(*sandbox, limit);
            } else {
                auto asked = co_await helper_->async_destroy(id, limit);
                // Not cancellable: wait for the confirmation until the bound, whatever the caller
                // does.
                while (asked && !sandbox->answered.is_set() && !limit.has_expired()) {
                    co_await sandbox->answered.async_wait(limit);
                }
                // The helper is gone, or it did not know this sandbox (it was started after a
                // helper that died): confirm through our own pidfd.
                if (!asked || sandbox->cleanup_errno == ESRCH)
                    co_await kill_without_helper(*sandbox, limit);
            }
        }
        if (!sandbox->reaped.is_set()) {
            // The janitor finishes what this destroy could not confirm.
            sandbox->record.condemned = true;
            (void)records_.write(sandbox->record);
            co_return unconfirmed_error(id);
        }
        sandbox->root.reset();
        // Our helper removes the cgroups of what it reaps and reports it; anything else (attached,
        // a survivor of a lost helper, one a later helper did not know) is ours to remove.
        int cleanup_errno = sandbox->cleanup_errno;
        const bool helper_cleaned = sandbox->answered.is_set() && cleanup_errno != ESRCH;
        if (!helper_cleaned) cleanup_errno = co_await remove_cgroups_until(sandbox->record, limit);
        records_.remove(id);
        sandboxes_.erase(id);
        if (cleanup_errno != 0) co_return cgroups_left_error(id, cleanup_errno);
        detail::log(log_level::debug, "local", "destroyed", id);
        co_return result<void>{};
    }

    // A sandbox this backend has not attached: known only from its record. Its pid 1 is killed
    // through a pidfd checked against the recorded start time; a stale record is cleaned up.
    asio::awaitable<result<void>> destroy_recorded(std::string id, deadline limit) {
        auto record = records_.read(id);
        if (!record) co_return std::move(record).error();
        if (record->init_pid == 0 && record->owner_pid > 0 && ::kill(record->owner_pid, 0) == 0 &&
            std::chrono::system_clock::now() - record->created_at < create_timeout) {
            co_return make_error(errc::sandbox_unavailable,
                                 "sandbox " + id + " is still being created by process " +
                                     std::to_string(record->owner_pid) + "; try again");
        }
        if (auto pidfd = open_live_init(*record)) {
            const bool ended = co_await kill_and_wait(pidfd->get(), limit);
            if (!ended) {
                record->condemned = true;
                (void)records_.write(*record);
                co_return unconfirmed_error(id);
            }
        }
        const int cleanup_errno = co_await remove_cgroups_until(*record, limit);
        records_.remove(id);
        if (cleanup_errno != 0) co_return cgroups_left_error(id, cleanup_errno);
        detail::log(log_level::debug, "local", "destroyed (recorded)", id);
        co_return result<void>{};
    }

    static error cgroups_left_error(const std::string& id, int err) {
        return make_error(
            errc::backend_failure,
            "sandbox " + id + " is gone but its cgroups were not removed: " + std::strerror(err));
    }

    // Removes the record's cgroups, retrying while the kernel still counts the exiting tasks.
    asio::awaitable<int> remove_cgroups_until(const sandbox_record& record, deadline limit) {
        asio::steady_timer timer(executor_);
        for (;;) {
            const int err = remove_cgroups(record);
            if (err != EBUSY || limit.has_expired()) co_return err;
            timer.expires_after(std::chrono::milliseconds(10));
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_await asio::this_coro::reset_cancellation_state();
        }
    }

    // Once per backend, at its first create or list: what an earlier process left that is proven
    // dead (janitor_rules.hpp's is_sweepable: a survivor that ended at its TTL with no moat
    // process alive) loses its cgroups, socket and record, so it does not wait for a janitor.
    // Bounded in records looked at, in records removed and in time; system calls only (one
    // removal attempt: cgroups the kernel still counts as busy are left for the janitor).
    void sweep_dead_once() {
        if (swept_) return;
        swept_ = true;
        constexpr std::size_t max_looked = 256;
        constexpr std::size_t max_swept = 64;
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
        std::size_t looked = 0;
        std::size_t swept = 0;
        for (const auto& id : records_.ids()) {
            if (looked++ == max_looked || swept == max_swept ||
                std::chrono::steady_clock::now() > until)
                break;
            if (sandboxes_.contains(id)) continue;
            auto record = records_.read(id);
            if (!record || !is_sweepable(*record)) continue;
            if (const int err = remove_cgroups(*record); err != 0) {
                detail::log(log_level::info, "local",
                            std::string("left for the janitor: its cgroups: ") + std::strerror(err),
                            id);
                continue;
            }
            records_.remove(id);
            ++swept;
            detail::log(log_level::info, "local", "swept: its pid 1 is gone", id);
        }
    }

    // The rules are in janitor_rules.hpp; this walks the state directory and the cgroup tree.
    asio::awaitable<result<std::vector<janitor_action>>> janitor(bool dry_run) {
        std::vector<janitor_action> actions;
        std::set<std::string> recorded;
        std::vector<sandbox_record> records;
        const auto now = std::chrono::system_clock::now();
        for (const auto& id : records_.ids()) {
            recorded.insert(id);
            auto record = records_.read(id);
            if (!record) {
                actions.push_back({"report", id, record.error().detail, false, ""});
                continue;
            }
            records.push_back(*record);
            if (sandboxes_.contains(id)) continue;  // held here: its handle's business
            const std::string reason = janitor_reason(*record, now);
            if (reason.empty()) continue;
            janitor_action a{record->init_pid == 0 ? "remove_record" : "destroy", id, reason, false,
                             ""};
            if (!dry_run) {
                if (record->init_pid == 0) {
                    records_.remove(id);
                    a.done = true;
                } else {
                    auto destroyed =
                        co_await destroy_recorded(id, deadline::after(options_.destroy_timeout));
                    a.done = destroyed.has_value();
                    if (!destroyed) a.error = destroyed.error().to_string();
                }
            }
            actions.push_back(std::move(a));
        }
        for (const auto& dir : orphaned_cgroups(moat_cgroup_parents(records), recorded, now)) {
            janitor_action a{"remove_cgroup", dir, "no sandbox records it", false, ""};
            if (!dry_run) {
                const int err = remove_cgroup_tree(dir);
                a.done = err == 0;
                if (!a.done) a.error = std::strerror(err);
            }
            actions.push_back(std::move(a));
        }
        for (const auto& file :
             orphaned_files(wire::sandboxes_dir(options_.state_dir), recorded, now)) {
            janitor_action a{"remove_file", file, "no sandbox records it", false, ""};
            if (!dry_run) {
                a.done = ::unlink(file.c_str()) == 0 || errno == ENOENT;
                if (!a.done) a.error = std::strerror(errno);
            }
            actions.push_back(std::move(a));
        }
        co_return actions;
    }

    asio::awaitable<result<sandbox_info>> attach(std::string id) {
        if (auto it = sandboxes_.find(id); it != sandboxes_.end()) {
            if (it->second->gone_reason)
                co_return make_error(errc::sandbox_unavailable, *it->second->gone_reason);
            co_return it->second->info;
        }
        auto record = records_.read(id);
        if (!record) co_return std::move(record).error();
        auto pidfd = open_live_init(*record);
        if (!pidfd) co_return std::move(pidfd).error();
        if (!record->survive_owner) {
            co_return make_error(errc::sandbox_unavailable,
                                 "sandbox " + id +
                                     " was created without survive_owner: only its creator (" +
                                     record->owner_instance + ") can use it");
        }
        auto control = connect_to_agent(*record);
        if (!control) co_return std::move(control).error();

        auto sandbox = std::make_shared<local_sandbox>(executor_);
        sandbox->info = describe(*record);  // running: checked through the pidfd above
        sandbox->pidfd = std::move(*pidfd);
        sandbox->record = std::move(*record);
        sandbox->oom->memory_cgroup = sandbox->record.memory_cgroup;
        sandbox->oom->seen = read_oom_kill_count(sandbox->oom->memory_cgroup);
        sandbox->agent = std::make_shared<agent_channel>(executor_, std::move(*control), id);
        sandbox->agent->start(tasks_);
        sandboxes_[id] = sandbox;

        auto ready = co_await sandbox->agent->async_wait_ready(deadline::after(attach_timeout));
        if (ready) {
            // The attacher serves the proxy too, under the policy the record keeps.
            auto policy = egress::make_network_policy(sandbox->record.network);
            if (!policy) {
                ready = make_error(
                    errc::backend_failure,
                    "sandbox " + id + ": its recorded network: " + policy.error().detail);
            } else {
                ready = start_egress(*sandbox, *policy);
            }
        }
        if (ready) ready = open_root(*sandbox);
        if (ready && is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            ready = make_error(errc::cancelled, "attach was cancelled");
        }
        if (!ready) {
            // Detach (the sandbox is not ours to end).
            stop_egress(*sandbox);
            sandbox->agent->close();
            sandboxes_.erase(id);
            if (has_exited(sandbox->pidfd.get())) {
                co_return make_error(errc::sandbox_unavailable,
                                     "sandbox " + id + " ended while attaching");
            }
            co_return std::move(ready).error();
        }
        detail::log(log_level::debug, "local", "attached", id);
        co_return sandbox->info;
    }

    // Connects to a survivor's attach socket and checks that its pid 1 is what listens there.
    result<unique_fd> connect_to_agent(const sandbox_record& record) {
        const std::string path = records_.socket_path(record.id);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        if (path.size() >= sizeof address.sun_path) {
            return make_error(errc::backend_failure, "attach socket path too long: " + path);
        }
        std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
        unique_fd socket(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!socket.is_open()) return stdio_error("socket");
        if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) !=
            0) {
            const int err = errno;
            if (err == EAGAIN) {
                return make_error(errc::limit_exceeded,
                                  "sandbox " + record.id + " has too many pending attaches");
            }
            if (err == ENOENT || err == ECONNREFUSED) {
                return make_error(errc::sandbox_unavailable, "sandbox " + record.id +
                                                                 " does not accept attaches (" +
                                                                 std::strerror(err) + ")");
            }
            return make_error(errc::backend_failure,
                              "connect to " + path + ": " + std::strerror(err));
        }
        ucred peer{};
        socklen_t length = sizeof peer;
        if (::getsockopt(socket.get(), SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 ||
            peer.pid != record.init_pid || peer.uid != record.uid_base) {
            return make_error(errc::protocol_error, "the attach socket of " + record.id +
                                                        " is not served by the sandbox's pid 1");
        }
        return socket;
    }

    // The O_PATH root the file operations resolve under, opened once pid 1 is ready.
    static result<void> open_root(local_sandbox& sandbox) {
        auto root = open_sandbox_root(sandbox.record.init_pid, sandbox.pidfd.get());
        if (!root) return std::move(root).error();
        sandbox.root = std::move(*root);
        return {};
    }

    // A sandbox whose pid 1 is gone (seen through the pidfd) reports `exited` even before the
    // helper's report or the channel's end arrives.
    static void refresh_state(local_sandbox& sandbox) {
        if (sandbox.info.state == sandbox_state::running && sandbox.pidfd.is_open() &&
            has_exited(sandbox.pidfd.get())) {
            sandbox.info.state = sandbox_state::exited;
        }
    }

    // A command the agent has started: its output stream (which owns it: dropping the stream
    // kills it) and, for spawn, our end of its stdin.
    struct started_command {
        std::unique_ptr<local_exec_stream> stream;
        unique_fd stdin_socket;
        std::shared_ptr<agent_channel> agent;
        std::uint64_t exec_id = 0;
        int pid = 0;
    };

    asio::awaitable<result<exec_stream>> start_exec(std::string id, exec_request request) {
        std::string stdin_data = std::move(request.stdin_data);
        // An exec's processes end with it (its own cgroup, where the sandbox has them).
        const auto ceiling = exec_request::max_wall_limit;
        auto started = co_await start_command(std::move(id), std::move(request), ceiling,
                                              wire::exec_own_cgroup);
        if (!started) co_return std::move(started).error();
        if (!stdin_data.empty()) {
            auto socket = std::make_shared<asio::posix::stream_descriptor>(
                executor_, started->stdin_socket.release());
            tasks_.spawn(feed_stdin(std::move(socket), std::move(stdin_data)));
        }
        co_return exec_stream(std::move(started->stream));
    }

    asio::awaitable<result<process>> spawn(std::string id, exec_request request) {
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

    asio::awaitable<result<started_command>> start_command(
        std::string id, exec_request request,
        std::chrono::milliseconds ceiling = exec_request::max_wall_limit,
        std::uint32_t exec_flags = wire::exec_none) {
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
        for (const auto& [k, v] : sandbox->record.env) env[k] = v;
        for (const auto& [k, v] : request.env) env[k] = v;
        // Forced: the sandbox's code cannot point them elsewhere (there is nowhere else anyway).
        for (auto& [k, v] :
             egress::proxy_environment(sandbox->record.network.mode, sandbox_network::proxy_port))
            env[k] = std::move(v);
        std::vector<std::string> env_list;
        for (const auto& [k, v] : env) env_list.push_back(k + "=" + v);
        const std::string cwd = request.cwd.empty() ? sandbox->record.layout.workdir : request.cwd;

        const std::uint64_t exec_id = next_exec_id_++;
        std::vector<std::byte> record;
        if (!wire::encode_exec(exec_id, static_cast<std::uint64_t>(request.wall_limit.count()),
                               argv, env_list, cwd, record, exec_flags)) {
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
        command.oom = sandbox->oom;
        command.kill_grace = options_.kill_grace;
        command.backstop = deadline::after(request.wall_limit + wall_limit_slack);
        command.resident = request.resident;

        const int child_ends[3] = {pipes.stdin_theirs.get(), pipes.out_theirs.get(),
                                   pipes.err_theirs.get()};
        const auto start_limit = deadline::after(start_timeout);
        auto state = co_await sandbox->agent->async_exec(exec_id, record, child_ends, start_limit);
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
            co_return make_error(errc::backend_failure,
                                 "the sandbox agent did not start the command");
        }
        if ((*state)->start) started.pid = (*state)->start->pid;
        co_return started;
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

    static std::map<std::string, std::string> base_environment(const sandbox_layout& layout) {
        return {
            {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", layout.home}, {"LANG", "C.UTF-8"}};
    }

    result<std::shared_ptr<local_sandbox>> find(const std::string& id) {
        auto it = sandboxes_.find(id);
        if (it != sandboxes_.end()) return it->second;
        auto record = records_.read(id);
        if (record) {
            return make_error(
                errc::sandbox_not_found,
                "sandbox " + id + " belongs to " + record->owner_instance + "; attach to it first");
        }
        return std::move(record).error();
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
        const std::uint32_t uid_base = sandbox.record.uid_base;
        return sandbox_root{sandbox.root.get(), uid_base + wire::sandbox_user_id,
                            uid_base + wire::sandbox_group_id};
    }

    // The helper cannot confirm (it is gone, never knew this sandbox, or it was attached): kill
    // pid 1 through our own pidfd and wait for it to report the exit. The kernel ends every
    // process of the pid namespace before pid 1 can exit.
    asio::awaitable<void> kill_without_helper(local_sandbox& sandbox, deadline limit) {
        if (!sandbox.pidfd.is_open()) co_return;
        const bool ended = co_await kill_and_wait(sandbox.pidfd.get(), limit);
        if (ended) sandbox.reaped.set();
    }

    // SIGKILLs the process behind `pidfd` (the caller's, which must stay open meanwhile) and
    // waits until it has exited; false at `limit`. The wait registers a duplicate it owns, so the
    // caller's descriptor is never closed or registered with the reactor here.
    asio::awaitable<bool> kill_and_wait(int pidfd, deadline limit) {
        ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
        unique_fd watched(::fcntl(pidfd, F_DUPFD_CLOEXEC, 0));
        if (!watched.is_open()) co_return co_await poll_until_exited(pidfd, limit);
        asio::posix::stream_descriptor descriptor(executor_, watched.release());
        const auto waited =
            co_await async_wait_until(descriptor, asio::posix::descriptor_base::wait_read, limit);
        co_return waited == wait_result::ready;
    }

    // Out of descriptors for the duplicate: look every 10 ms instead.
    asio::awaitable<bool> poll_until_exited(int pidfd, deadline limit) {
        asio::steady_timer timer(executor_);
        while (!has_exited(pidfd)) {
            if (limit.has_expired()) co_return false;
            timer.expires_after(std::chrono::milliseconds(10));
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_await asio::this_coro::reset_cancellation_state();
        }
        co_return true;
    }

    // Starts serving the sandbox's egress proxy: registers its policy with the backend's proxy
    // and accepts on the listener its agent handed over with `ready`. Nothing for network none.
    result<void> start_egress(local_sandbox& sandbox, const egress::network_policy& policy) {
        unique_fd listener = sandbox.agent->take_egress_listener();
        if (policy.mode() == egress::network_mode::none) return {};
        const std::string& id = sandbox.info.id;
        if (!listener.is_open() || sandbox.agent->egress_port() != sandbox_network::proxy_port) {
            return make_error(errc::backend_failure,
                              "sandbox " + id + ": its agent handed over no egress listener");
        }
        if (!egress_) egress_ = std::make_shared<egress::egress_proxy>(executor_, log_egress_event);
        if (auto added = egress_->add_sandbox(id, policy, egress::egress_limits{}); !added)
            return added;
        auto acceptor = std::make_shared<egress_acceptor>(executor_);
        asio::error_code ec;
        acceptor->assign(asio::generic::stream_protocol(AF_INET, IPPROTO_TCP), listener.get(), ec);
        if (ec) {
            egress_->close_sandbox(id);
            return make_error(errc::backend_failure,
                              "sandbox " + id + ": the egress listener: " + ec.message());
        }
        (void)listener.release();
        sandbox.egress = acceptor;
        tasks_.spawn(serve_egress(acceptor, egress_, id));
        return {};
    }

    // Stops serving the sandbox's proxy: our copy of its listener closes (the agent and other
    // attached processes keep theirs) and every connection we proxy for it closes at once.
    void stop_egress(local_sandbox& sandbox) {
        if (!sandbox.egress) return;
        asio::error_code ignored;
        sandbox.egress->close(ignored);
        sandbox.egress.reset();
        if (egress_) egress_->close_sandbox(sandbox.info.id);
    }

    void on_reaped(const wire::reaped_message& m) {
        auto it = sandboxes_.find(std::string(wire::read_field(m.sandbox_id)));
        if (it == sandboxes_.end()) return;
        auto& sandbox = *it->second;
        sandbox.cleanup_errno = m.cleanup_errno;
        sandbox.answered.set();
        if (m.cleanup_errno == ESRCH) return;  // async_destroy confirms through the pidfd
        // Nobody asked for this end (TTL, a crash, a kill from outside): say so, unless the agent
        // channel already did.
        if (!sandbox.destroying && sandbox.agent && !sandbox.agent->broken()) {
            detail::log(
                log_level::warning, "local",
                "the sandbox's pid 1 exited (wait status " + std::to_string(m.wait_status) + ")",
                sandbox.info.id);
        }
        // Confirmed gone and its cgroups removed: the record goes now, the entry (inspect says
        // `exited`) when destroy releases it.
        records_.remove(sandbox.info.id);
        sandbox.info.state = sandbox_state::exited;
        if (!sandbox.gone_reason) sandbox.gone_reason = "the sandbox's pid 1 exited";
        // Keep only the record (inspect says `exited`) until destroy releases it.
        stop_egress(sandbox);
        if (sandbox.agent) sandbox.agent->close();
        sandbox.agent.reset();
        sandbox.pidfd.reset();
        sandbox.root.reset();  // it pins the sandbox's mounts (its tmpfs memory)
        sandbox.reaped.set();
    }

    // Only what depends on the helper ends with it: the sandboxes it made that die with it
    // (PDEATHSIG). An attached sandbox, or a survivor it made, keeps its own control socket to its
    // pid 1 and runs on; its destroy confirms through the pidfd.
    void on_helper_lost(const std::string& reason) {
        for (auto& [id, sandbox] : sandboxes_) {
            if (!sandbox->info.owned || sandbox->info.survive_owner) continue;
            if (!sandbox->gone_reason) sandbox->gone_reason = reason;
            sandbox->info.state = sandbox_state::exited;
            stop_egress(*sandbox);
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
    sandbox_records records_{""};
    std::map<std::string, std::shared_ptr<local_sandbox>> sandboxes_;
    // The egress proxy of this backend's sandboxes whose network is not none, made by the first.
    std::shared_ptr<egress::egress_proxy> egress_;
    std::uint64_t next_exec_id_ = 1;
    bool swept_ = false;  // sweep_dead_once ran
    // Streamed file I/O, started by the first stream (joined first by the destructor).
    std::unique_ptr<asio::thread_pool> file_pool_;
};

}  // namespace

std::unique_ptr<backend> make_local_backend(asio::any_io_executor executor, local_options options) {
    return std::make_unique<local_backend>(std::move(executor), std::move(options));
}

}  // namespace moat
