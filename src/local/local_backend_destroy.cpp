// Ending sandboxes (local_backend_impl.hpp is the contract between the local backend's files):
// destroy, one flight per sandbox shared by every caller, confirmed by the helper or through the
// backend's own pidfd; the destroy of a sandbox known only from its record; the sweep of what an
// earlier process left dead; and the janitor's walk of the state directory and the cgroup tree.
#include "local/local_backend_impl.hpp"

#include <moat/log.hpp>

#include "core/asio_compat.hpp"
#include "core/descriptor_wait.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"
#include "local/helper_client.hpp"
#include "local/janitor_rules.hpp"
#include "wire/state_layout.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <set>

namespace moat {

asio::awaitable<result<void>> local_backend::async_destroy(std::string id) {
    return guarded(destroy(std::move(id)));
}

asio::awaitable<result<void>> local_backend::destroy(std::string id) {
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

error local_backend::unconfirmed_error(const std::string& id) const {
    return make_error(errc::backend_failure, "destroy of " + id + " was not confirmed within " +
                                                 std::to_string(options_.destroy_timeout.count()) +
                                                 " ms");
}

asio::awaitable<result<void>> local_backend::destroy_known(std::shared_ptr<local_sandbox> sandbox,
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

asio::awaitable<result<void>> local_backend::destroy_recorded(std::string id, deadline limit) {
    auto record = records_.read(id);
    if (!record) co_return std::move(record).error();
    if (record->init_pid == 0 && record->owner_pid > 0 && ::kill(record->owner_pid, 0) == 0 &&
        std::chrono::system_clock::now() - record->created_at < create_timeout) {
        co_return make_error(errc::sandbox_unavailable,
                             "sandbox " + id + " is still being created by process " +
                                 std::to_string(record->owner_pid) + "; try again");
    }
    if (auto pidfd = open_live_init(*record)) {
        thaw_v1_commands(*record);
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

error local_backend::cgroups_left_error(const std::string& id, int err) {
    return make_error(
        errc::backend_failure,
        "sandbox " + id + " is gone but its cgroups were not removed: " + std::strerror(err));
}

asio::awaitable<int> local_backend::remove_cgroups_until(const sandbox_record& record,
                                                         deadline limit) {
    asio::steady_timer timer(executor_);
    for (;;) {
        const int err = remove_cgroups(record);
        if (err != EBUSY || limit.has_expired()) co_return err;
        timer.expires_after(std::chrono::milliseconds(10));
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_await asio::this_coro::reset_cancellation_state();
    }
}

asio::awaitable<void> local_backend::kill_without_helper(local_sandbox& sandbox, deadline limit) {
    if (!sandbox.pidfd.is_open()) co_return;
    thaw_v1_commands(sandbox.record);
    const bool ended = co_await kill_and_wait(sandbox.pidfd.get(), limit);
    if (ended) sandbox.reaped.set();
}

asio::awaitable<bool> local_backend::kill_and_wait(int pidfd, deadline limit) {
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    unique_fd watched(::fcntl(pidfd, F_DUPFD_CLOEXEC, 0));
    if (!watched.is_open()) co_return co_await poll_until_exited(pidfd, limit);
    asio::posix::stream_descriptor descriptor(executor_, watched.release());
    const auto waited =
        co_await async_wait_until(descriptor, asio::posix::descriptor_base::wait_read, limit);
    co_return waited == wait_result::ready;
}

asio::awaitable<bool> local_backend::poll_until_exited(int pidfd, deadline limit) {
    asio::steady_timer timer(executor_);
    while (!has_exited(pidfd)) {
        if (limit.has_expired()) co_return false;
        timer.expires_after(std::chrono::milliseconds(10));
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_await asio::this_coro::reset_cancellation_state();
    }
    co_return true;
}

void local_backend::sweep_dead_once() {
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

asio::awaitable<result<std::vector<janitor_action>>> local_backend::async_janitor(bool dry_run) {
    return guarded(janitor(dry_run));
}

asio::awaitable<result<std::vector<janitor_action>>> local_backend::janitor(bool dry_run) {
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

}  // namespace moat
