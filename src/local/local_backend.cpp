// The local backend's lifecycle (local_backend_impl.hpp is the contract between its files):
// construction, create, attach, inspect, list, extend TTL and the host report; the helper's
// reports (a sandbox reaped, the helper lost); and the glue to the egress proxy, which serves the
// listener each sandbox's agent hands over.
#include "local/local_backend_impl.hpp"

#include <moat/log.hpp>
#include <moat/templates.hpp>

#include "core/asio_compat.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "egress/egress_proxy.hpp"
#include "egress/network_policy.hpp"
#include "local/agent_channel.hpp"
#include "local/helper_client.hpp"
#include "local/sandbox_id.hpp"
#include "local/spec_validation.hpp"
#include "wire/protocol.hpp"

#include <asio/basic_socket_acceptor.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace moat {

// The library's copy of a sandbox's egress listener (a TCP socket listening at 127.0.0.1 in the
// sandbox's network namespace, handed over by its agent): accepted on here, from the host's side.
struct egress_listener : asio::basic_socket_acceptor<asio::generic::stream_protocol> {
    using basic_socket_acceptor::basic_socket_acceptor;
};

namespace {

constexpr auto helper_start_timeout = std::chrono::seconds(10);
constexpr auto ready_timeout = std::chrono::seconds(10);
// How long the agent may take to confirm a control request (a TTL change).
constexpr auto control_timeout = std::chrono::seconds(5);
// How long an attach may take: connect, the agent's `ready`.
constexpr auto attach_timeout = std::chrono::seconds(5);
// The name of the sandbox user (uid 1000) in the template root's /etc/passwd.
constexpr const char* default_user = "user";

// How long the accept loop waits after an accept error other than its own close (EMFILE, ...)
// before it tries again.
constexpr auto egress_accept_retry = std::chrono::milliseconds(100);

// Accepts on a sandbox's egress listener until it is closed, handing every connection to the
// proxy. Holds the proxy and the acceptor, so it never outlives either.
asio::awaitable<void> serve_egress(std::shared_ptr<egress_listener> acceptor,
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
void add_usage(sandbox_info& info, const sandbox_record& r, const sandbox_records& records) {
    info.memory_used_bytes.reset();
    info.pids_current.reset();
    info.cpu_time_us.reset();
    info.disk_used_bytes.reset();
    info.disk_total_bytes.reset();
    if (info.state == sandbox_state::exited) return;
    info.memory_used_bytes = read_memory_used(r.cgroups);
    info.pids_current = read_cgroup_number(r.cgroups, "pids.current");
    info.cpu_time_us = read_cpu_time_us(r.cgroups);
    const std::string root = "/proc/" + std::to_string(r.init_pid) + "/root";
    if (const int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
        sandbox_usage disk;
        read_disk_usage(fd, disk);
        ::close(fd);
        info.disk_used_bytes = disk.disk_used_bytes;
        info.disk_total_bytes = disk.disk_total_bytes;
    }
    if (r.network.mode == network_mode::none) return;
    if (auto meter = egress::read_meter_file(records.egress_meter_path(r.id))) {
        info.egress_bytes_used = meter->bytes_used;
        info.egress_buffered_bytes = meter->buffered_bytes;
    }
}

// A recorded sandbox another process holds: its state checked through a pidfd.
sandbox_info info_from_record(const sandbox_record& r) {
    sandbox_info info = describe_record(r);
    if (!open_live_init(r)) info.state = sandbox_state::exited;
    return info;
}

std::string default_state_dir() {
    if (::geteuid() == 0) return "/run/moat";
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime == '/') {
        return std::string(runtime) + "/moat";
    }
    return "/tmp/moat-" + std::to_string(::geteuid());
}

}  // namespace

local_backend::local_backend(asio::any_io_executor executor, local_options options)
    : executor_(std::move(executor)),
      options_(std::move(options)),
      tasks_(executor_, "local backend") {
    if (options_.state_dir.empty()) options_.state_dir = default_state_dir();
    if (options_.owner_instance.empty()) options_.owner_instance = default_owner_instance();
    if (options_.data_dir.empty()) options_.data_dir = default_data_dir();
    records_ = sandbox_records(options_.state_dir);
    helper_ = std::make_shared<helper_client>(executor_, tasks_, options_);
    helper_->on_reaped = [this](const wire::reaped_message& m) { on_reaped(m); };
    helper_->on_helper_lost = [this](const std::string& reason) { on_helper_lost(reason); };
}

local_backend::~local_backend() {
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

asio::awaitable<result<sandbox_info>> local_backend::async_create(sandbox_spec spec) {
    return guarded(create(std::move(spec)));
}

asio::awaitable<result<sandbox_info>> local_backend::create(sandbox_spec spec) {
    if (auto invalid = validate_spec(spec); !invalid) co_return std::move(invalid).error();
    auto policy = egress::make_network_policy(spec.network);
    if (!policy) co_return std::move(policy).error();
    sweep_dead_once();
    auto started = co_await helper_->async_ensure_started(deadline::after(helper_start_timeout));
    if (!started) co_return std::move(started).error();
    // A host the helper cannot work on (not root, a state directory sandbox uids cannot
    // reach) fails every create with the helper's own reason, before anything is recorded.
    if (auto unusable = helper_->setup_error()) co_return *unusable;

    // A template of the data directory: its record is read now (a small file), its layer is
    // mounted by the helper.
    std::optional<template_info> chosen;
    if (!spec.template_name.empty() && spec.template_name != base_template_name) {
        auto found = template_store(options_.data_dir).find(spec.template_name);
        if (!found) co_return std::move(found).error();
        chosen = std::move(*found);
    }

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
    if (spec.network.mode != network_mode::none) request.egress_port = sandbox_network::proxy_port;
    request.flags = (spec.best_effort ? wire::create_best_effort : 0u) |
                    (spec.survive_owner ? wire::create_survive_owner : 0u) |
                    (spec.allow_sudo ? wire::create_allow_sudo : 0u);
    wire::copy_field(request.user_name, spec.layout.user);
    wire::copy_field(request.home, spec.layout.home);
    wire::copy_field(request.workdir, spec.layout.workdir);
    wire::copy_field(request.artifacts_dir, spec.layout.artifacts_dir);
    if (chosen) {
        const std::string layer = template_store(options_.data_dir).layer_root(chosen->digest);
        if (layer.size() >= sizeof request.template_layer)
            co_return make_error(errc::invalid_argument,
                                 "data_dir: the template layer path " + layer + " is too long");
        wire::copy_field(request.template_layer, layer);
        // A path the helper refuses: no Python environment rather than no sandbox.
        if (chosen->python.size() < sizeof request.template_python)
            wire::copy_field(request.template_python, chosen->python);
    }

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
    record.paused_lifetime = spec.paused_lifetime;
    record.env = spec.env;
    record.layout = spec.layout;
    if (record.layout.user.empty()) record.layout.user = default_user;
    record.limits = limits;
    record.network = spec.network;
    record.network_limit = options_.network_limit.value_or(spec.network);
    record.egress = options_.egress;
    if (chosen) {
        record.template_name = chosen->name;
        record.template_digest = chosen->digest;
    }
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
    const bool cancelled_while_made = is_cancelled(co_await asio::this_coro::cancellation_state);
    if (cancelled_while_made) co_await asio::this_coro::reset_cancellation_state();
    record.init_pid = made->message.host_pid;
    record.init_start_ticks = made->message.start_time_ticks;
    record.uid_base = made->message.uid_base;
    record.memory_cgroup = std::string(wire::read_field(made->message.memory_cgroup));
    for (const auto* field : {&made->message.memory_cgroup, &made->message.pids_cgroup,
                              &made->message.cpu_cgroup, &made->message.tracking_cgroup}) {
        const std::string_view dir = wire::read_field(*field);
        if (!dir.empty() &&
            std::find(record.cgroups.begin(), record.cgroups.end(), dir) == record.cgroups.end())
            record.cgroups.emplace_back(dir);
    }
    record.layers = layer_names(made->message.applied_layers);

    auto sandbox = std::make_shared<local_sandbox>(executor_);
    sandbox->info = describe_record(record);
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
    if (ready) ready = start_egress(sandbox, *policy);
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
        if (!destroyed) detail::log(log_level::error, "local", destroyed.error().to_string(), id);
        co_return std::move(ready).error();
    }
    detail::log(log_level::debug, "local", "created", id);
    co_return sandbox->info;
}

asio::awaitable<result<sandbox_info>> local_backend::async_attach(std::string id) {
    return guarded(attach(std::move(id)));
}

asio::awaitable<result<sandbox_info>> local_backend::attach(std::string id) {
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
    sandbox->info = describe_record(*record);  // running: checked through the pidfd above
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
            ready =
                make_error(errc::backend_failure,
                           "sandbox " + id + ": its recorded network: " + policy.error().detail);
        } else {
            ready = start_egress(sandbox, *policy);
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

result<unique_fd> local_backend::connect_to_agent(const sandbox_record& record) {
    const std::string path = records_.socket_path(record.id);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.size() >= sizeof address.sun_path) {
        return make_error(errc::backend_failure, "attach socket path too long: " + path);
    }
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    unique_fd socket(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!socket.is_open()) return stdio_error("socket");
    if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
        const int err = errno;
        if (err == EAGAIN) {
            return make_error(errc::limit_exceeded,
                              "sandbox " + record.id + " has too many pending attaches");
        }
        if (err == ENOENT || err == ECONNREFUSED) {
            return make_error(
                errc::sandbox_unavailable,
                "sandbox " + record.id + " does not accept attaches (" + std::strerror(err) + ")");
        }
        return make_error(errc::backend_failure, "connect to " + path + ": " + std::strerror(err));
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

result<void> local_backend::open_root(local_sandbox& sandbox) {
    auto root = open_sandbox_root(sandbox.record.init_pid, sandbox.pidfd.get());
    if (!root) return std::move(root).error();
    sandbox.root = std::move(*root);
    return {};
}

asio::awaitable<result<sandbox_info>> local_backend::async_inspect(std::string id) {
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

void local_backend::refresh_state(local_sandbox& sandbox) {
    if (sandbox.info.state != sandbox_state::exited && sandbox.pidfd.is_open() &&
        has_exited(sandbox.pidfd.get())) {
        sandbox.info.state = sandbox_state::exited;
    }
    if (sandbox.info.state != sandbox_state::exited) sync_pause_state(sandbox);
}

result<std::shared_ptr<local_sandbox>> local_backend::find(const std::string& id) {
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

result<std::shared_ptr<local_sandbox>> local_backend::find_running(const std::string& id) {
    auto found = find(id);
    if (!found) return found;
    const auto& sandbox = *found;
    if (sandbox->gone_reason || !sandbox->agent) {
        return make_error(errc::sandbox_unavailable,
                          sandbox->gone_reason.value_or("the sandbox has ended"));
    }
    return found;
}

asio::awaitable<result<host_report>> local_backend::async_host_report() {
    try {
        auto started =
            co_await helper_->async_ensure_started(deadline::after(helper_start_timeout));
        if (!started) co_return std::move(started).error();
        host_report report;
        report.layers = layer_names(helper_->host_layers());
        report.detail = helper_->layer_detail();
        report.facts["state_dir"] = options_.state_dir;
        report.facts["data_dir"] = options_.data_dir;
        report.facts["owner_instance"] = options_.owner_instance;
        co_return report;
    } catch (...) {
        co_return error_from_exception(std::current_exception());
    }
}

asio::awaitable<result<std::vector<sandbox_info>>> local_backend::async_list(label_filter filter) {
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
            // Measured now for the sandboxes this process serves (published to the meter).
            if (egress_) (void)egress_->stats(id);
            add_usage(out.back(), sandbox->record, records_);
        }
        for (const auto& id : records_.ids()) {
            if (sandboxes_.contains(id)) continue;
            // A record that vanished or is corrupt is skipped here; inspect reports it.
            auto record = records_.read(id);
            if (!record) continue;
            auto info = info_from_record(*record);
            if (!matches(info)) continue;
            add_usage(info, *record, records_);
            out.push_back(std::move(info));
        }
        co_return out;
    } catch (...) {
        co_return error_from_exception(std::current_exception());
    }
}

asio::awaitable<result<sandbox_info>> local_backend::async_extend_ttl(
    std::string id, std::chrono::milliseconds ttl) {
    return guarded(extend_ttl(std::move(id), ttl));
}

asio::awaitable<result<sandbox_info>> local_backend::extend_ttl(std::string id,
                                                                std::chrono::milliseconds ttl) {
    if (auto invalid = validate_ttl(ttl); !invalid) co_return std::move(invalid).error();
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    sync_pause_state(*sandbox);
    if (sandbox->record.paused_at) co_return set_ttl_left(*sandbox, ttl);
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
    // Read again under the record lock: another process may have changed its network meanwhile.
    const auto set_end = [&](sandbox_record& r) -> result<void> {
        r.expires_at = requested;
        return {};
    };
    if (auto written = records_.update(id, set_end); !written) {
        detail::log(log_level::warning, "local", written.error().to_string(), id);
    }
    co_return sandbox->info;
}

result<void> local_backend::start_egress(const std::shared_ptr<local_sandbox>& held,
                                         const egress::network_policy& policy) {
    auto& sandbox = *held;
    unique_fd listener = sandbox.agent->take_egress_listener();
    // A sandbox made with a network keeps its endpoint even while an update has turned it off.
    if (!listener.is_open() && policy.mode() == egress::network_mode::none) return {};
    const std::string& id = sandbox.info.id;
    if (!listener.is_open() || sandbox.agent->egress_port() != sandbox_network::proxy_port) {
        return make_error(errc::backend_failure,
                          "sandbox " + id + ": its agent handed over no egress listener");
    }
    if (!egress_) egress_ = std::make_shared<egress::egress_proxy>(executor_, log_egress_event);
    // The byte budget is the sandbox's, whichever process serves it: one meter beside its record.
    auto meter = egress::byte_meter::open_file(records_.egress_meter_path(id));
    if (!meter)
        return make_error(errc::backend_failure, "sandbox " + id + ": " + meter.error().detail);
    egress::egress_limits limits;
    limits.max_bytes = sandbox.record.egress.max_bytes;
    limits.max_connections = sandbox.record.egress.max_connections;
    limits.max_buffered_bytes = sandbox.record.egress.max_buffered_bytes;
    auto source = policy_source_for(held);
    if (auto added = egress_->add_sandbox(id, policy, limits, std::move(*meter), source); !added)
        return added;
    auto acceptor = std::make_shared<egress_listener>(executor_);
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

void local_backend::stop_egress(local_sandbox& sandbox) {
    if (!sandbox.egress) return;
    asio::error_code ignored;
    sandbox.egress->close(ignored);
    sandbox.egress.reset();
    if (egress_) egress_->close_sandbox(sandbox.info.id);
}

void local_backend::on_reaped(const wire::reaped_message& m) {
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

void local_backend::on_helper_lost(const std::string& reason) {
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

std::unique_ptr<backend> make_local_backend(asio::any_io_executor executor, local_options options) {
    return std::make_unique<local_backend>(std::move(executor), std::move(options));
}

}  // namespace moat
