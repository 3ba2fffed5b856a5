// Pause and resume of a local sandbox (local_backend_impl.hpp is the contract between the
// backend's files). The library freezes the commands' cgroup v2 subtree itself (`commands`, under
// the sandbox's own tree or, on a hybrid host, its tracking tree: every process but pid 1; on a
// host without a cgroup2 mount, the sandbox's `commands` cgroup in the v1 freezer), and
// tells pid 1 (set_paused) so that its clocks agree: wall limits stand still, and the sandbox ends
// at its paused lifetime instead of its TTL. The record keeps the pause (paused_at, ttl_left, the
// paused lifetime's end as expires_at), so another process, the helper's TTL backstop and the
// janitor all see it; the commands' cgroup.freeze (v1: freezer.state) is the truth a process checks
// against.
#include "local/local_backend_impl.hpp"

#include <moat/log.hpp>

#include "core/asio_compat.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace moat {
namespace {

constexpr auto pause_timeout = std::chrono::seconds(5);

// Where the sandbox's commands are frozen: the commands' cgroup.freeze of its cgroup v2 tree, or
// (v1) the commands' freezer.state in the v1 freezer; an empty path where it has neither.
struct freezer {
    std::string path;
    bool v1 = false;
    bool empty() const { return path.empty(); }
};

freezer freeze_file(const sandbox_record& record) {
    for (const auto& dir : record.cgroups) {
        std::string path = dir + "/commands/cgroup.freeze";
        if (::access(path.c_str(), F_OK) == 0) return {std::move(path), false};
        path = dir + "/commands/freezer.state";
        if (::access(path.c_str(), F_OK) == 0) return {std::move(path), true};
    }
    return {};
}

std::string read_text(const std::string& path) {
    char buffer[256];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    ::close(fd);
    return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

int write_text(const std::string& path, const char* text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const ssize_t n = ::write(fd, text, std::strlen(text));
    const int err = n < 0 ? errno : 0;
    ::close(fd);
    return err;
}

int set_frozen(const freezer& freeze, bool frozen) {
    if (freeze.v1) return write_text(freeze.path, frozen ? "FROZEN" : "THAWED");
    return write_text(freeze.path, frozen ? "1" : "0");
}

// Frozen, or freezing (v1: FREEZING until every task has stopped).
bool frozen_now(const freezer& freeze) {
    if (freeze.empty()) return false;
    const std::string state = read_text(freeze.path);
    return freeze.v1 ? !state.empty() && !state.starts_with("THAWED") : state.starts_with("1");
}

// Every process of the subtree is frozen: cgroup.events says so (v2), or freezer.state (v1).
bool freeze_complete(const freezer& freeze) {
    if (freeze.v1) return read_text(freeze.path).starts_with("FROZEN");
    const std::string& file = freeze.path;
    const std::string events = read_text(file.substr(0, file.rfind('/')) + "/cgroup.events");
    return events.find("frozen 1") != std::string::npos;
}

std::chrono::milliseconds whole_ms(std::chrono::system_clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

}  // namespace

asio::awaitable<result<sandbox_info>> local_backend::async_pause(std::string id) {
    return guarded(pause(std::move(id)));
}

asio::awaitable<result<sandbox_info>> local_backend::async_resume(std::string id) {
    return guarded(resume(std::move(id)));
}

bool local_backend::is_paused(const std::string& id) const {
    if (auto it = sandboxes_.find(id); it != sandboxes_.end()) {
        return frozen_now(freeze_file(it->second->record));
    }
    auto record = records_.read(id);
    return record && frozen_now(freeze_file(*record));
}

void local_backend::sync_pause_state(local_sandbox& sandbox) {
    const bool frozen = frozen_now(freeze_file(sandbox.record));
    if (frozen == sandbox.record.paused_at.has_value()) return;
    auto recorded = records_.read(sandbox.info.id);
    if (!recorded) return;
    sandbox.record.paused_at = recorded->paused_at;
    sandbox.record.ttl_left = recorded->ttl_left;
    sandbox.record.expires_at = recorded->expires_at;
    sandbox.info.paused_at = recorded->paused_at;
    sandbox.info.ttl_left = recorded->ttl_left;
    sandbox.info.expires_at = recorded->expires_at;
    sandbox.info.state = frozen ? sandbox_state::paused : sandbox_state::running;
}

sandbox_info local_backend::set_ttl_left(local_sandbox& sandbox, std::chrono::milliseconds ttl) {
    sandbox.record.ttl_left = ttl;
    sandbox.info.ttl_left = ttl;
    if (auto written = records_.write(sandbox.record); !written) {
        detail::log(log_level::warning, "local", written.error().to_string(), sandbox.info.id);
    }
    return sandbox.info;
}

asio::awaitable<result<sandbox_info>> local_backend::pause(std::string id) {
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    sync_pause_state(*sandbox);
    if (sandbox->record.paused_at) co_return sandbox->info;
    const freezer freeze = freeze_file(sandbox->record);
    if (freeze.empty()) {
        co_return make_error(errc::not_supported,
                             "pause needs the sandbox's cgroup v2 tree or, on a host without a "
                             "cgroup2 mount, a v1 freezer hierarchy, and this sandbox has neither");
    }
    auto agent = sandbox->agent;  // the sandbox may end while we wait
    const auto limit = deadline::after(pause_timeout);
    if (const int err = set_frozen(freeze, true)) {
        co_return make_error(errc::backend_failure,
                             "freeze " + freeze.path + ": " + std::strerror(err));
    }
    // Frozen once every task has stopped (usually at once; a task in a system call is stopped
    // when it returns to user space).
    asio::steady_timer timer(executor_);
    while (!freeze_complete(freeze) && !limit.has_expired()) {
        timer.expires_after(std::chrono::milliseconds(1));
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_await asio::this_coro::reset_cancellation_state();
    }
    if (!freeze_complete(freeze)) {
        (void)set_frozen(freeze, false);
        co_return make_error(errc::backend_failure,
                             "the sandbox's commands did not freeze within 5 s; it runs on");
    }
    const auto lifetime = sandbox->record.paused_lifetime;
    auto told = co_await agent->async_set_paused(true, lifetime, limit);
    if (!told) {
        (void)set_frozen(freeze, false);
        co_return std::move(told).error();
    }
    const auto now = std::chrono::system_clock::now();
    auto& record = sandbox->record;
    record.ttl_left = std::max(std::chrono::milliseconds(1), whole_ms(record.expires_at - now));
    record.paused_at = now;
    // No paused lifetime: the record's end is as far as a TTL may go.
    record.expires_at =
        now + (lifetime.count() > 0 ? lifetime : std::chrono::milliseconds(sandbox_spec::max_ttl));
    if (auto written = records_.write(record); !written) {
        detail::log(log_level::warning, "local", written.error().to_string(), id);
    }
    sandbox->info.state = sandbox_state::paused;
    sandbox->info.paused_at = record.paused_at;
    sandbox->info.ttl_left = record.ttl_left;
    sandbox->info.expires_at = record.expires_at;
    co_return sandbox->info;
}

asio::awaitable<result<sandbox_info>> local_backend::resume(std::string id) {
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    sync_pause_state(*sandbox);
    const freezer freeze = freeze_file(sandbox->record);
    if (!sandbox->record.paused_at && !frozen_now(freeze)) co_return sandbox->info;
    auto agent = sandbox->agent;
    const auto limit = deadline::after(pause_timeout);
    if (const int err = set_frozen(freeze, false)) {
        co_return make_error(errc::backend_failure,
                             "thaw " + freeze.path + ": " + std::strerror(err));
    }
    auto& record = sandbox->record;
    // Frozen without a recorded pause (its pauser died between the two): the TTL it had.
    const auto left = record.paused_at
                          ? record.ttl_left
                          : whole_ms(record.expires_at - std::chrono::system_clock::now());
    const auto ttl = std::max(std::chrono::milliseconds(1), left);
    auto told = co_await agent->async_set_paused(false, ttl, limit);
    if (!told) co_return std::move(told).error();
    const auto now = std::chrono::system_clock::now();
    record.paused_at.reset();
    record.ttl_left = std::chrono::milliseconds(0);
    record.expires_at = now + ttl;
    if (auto written = records_.write(record); !written) {
        detail::log(log_level::warning, "local", written.error().to_string(), id);
    }
    sandbox->info.state = sandbox_state::running;
    sandbox->info.paused_at.reset();
    sandbox->info.ttl_left = std::chrono::milliseconds(0);
    sandbox->info.expires_at = record.expires_at;
    co_return sandbox->info;
}

}  // namespace moat
