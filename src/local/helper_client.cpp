#include "local/helper_client.hpp"

#include <moat/log.hpp>

#include "core/descriptor_wait.hpp"
#include "local/sandboxd_launcher.hpp"

#include <asio/posix/stream_descriptor.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace moat {
namespace {

// The pid behind a pidfd (its fdinfo), or -1: for log lines.
int pid_of(int pidfd) {
    const std::string path = "/proc/self/fdinfo/" + std::to_string(pidfd);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char text[512] = {};
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return -1;
    const char* at = std::strstr(text, "\nPid:");
    return at != nullptr ? std::atoi(at + 5) : -1;
}

// The helper's largest record is `created` (four cgroup paths).
constexpr std::size_t max_helper_record = 4096;
static_assert(sizeof(wire::created_message) <= max_helper_record);

}  // namespace

asio::awaitable<void> run_helper_reader(std::shared_ptr<helper_client> self) {
    co_await self->read_loop();
}

namespace {

// Waits (bounded) for a SIGKILLed helper to exit, then reaps it. A pidfd polls readable once its
// process has exited.
asio::awaitable<void> reap_helper(asio::any_io_executor executor, unique_fd pidfd) {
    asio::posix::stream_descriptor exited(executor, pidfd.release());
    const auto limit = deadline::after(std::chrono::seconds(5));
    co_await async_wait_until(exited, asio::posix::descriptor_base::wait_read, limit);
    siginfo_t info{};
    // The application may reap children itself (or ignore SIGCHLD); ECHILD is fine then.
    ::waitid(P_PIDFD, static_cast<id_t>(exited.native_handle()), &info, WEXITED | WNOHANG);
}

}  // namespace

helper_client::helper_client(asio::any_io_executor executor, task_group& tasks,
                             local_options options)
    : executor_(std::move(executor)), tasks_(tasks), options_(std::move(options)) {}

helper_client::~helper_client() {
    shutdown();
}

asio::awaitable<result<void>> helper_client::async_ensure_started(deadline limit) {
    if (phase_ == phase::stopped) {
        phase_ = phase::starting;
        start_error_.reset();
        started_ = std::make_shared<async_event>(executor_);
        auto launched = launch_sandboxd(options_.sandboxd_path, options_.state_dir);
        if (!launched) {
            phase_ = phase::stopped;
            started_->set();
            co_return std::move(launched).error();
        }
        pidfd_ = std::move(launched->pidfd);
        channel_ = std::make_unique<seqpacket_channel>(executor_, std::move(launched->socket),
                                                       max_helper_record);
        tasks_.spawn(run_helper_reader(shared_from_this()));
    }
    if (phase_ == phase::starting) {
        auto started = started_;
        const auto outcome = co_await started->async_wait(limit);
        if (outcome == async_event::wait_outcome::cancelled) {
            co_return make_error(errc::cancelled, "cancelled while the sandbox helper started");
        }
    }
    if (phase_ == phase::running) co_return result<void>{};
    if (start_error_) co_return *start_error_;
    co_return make_error(errc::deadline_exceeded, "the sandbox helper did not start in time");
}

asio::awaitable<result<created_sandbox>> helper_client::async_create(wire::create_message request,
                                                                     deadline limit) {
    if (phase_ != phase::running) {
        co_return make_error(errc::backend_failure, "the sandbox helper is not running");
    }
    request.request_id = next_request_++;
    auto pending = std::make_shared<pending_create>(executor_);
    pending->sandbox_id = std::string(wire::read_field(request.sandbox_id));
    creates_[request.request_id] = pending;
    const auto bytes = std::as_bytes(std::span(&request, 1));
    const std::span<const int> no_descriptors;  // a named local (g++ 12)
    auto sent = co_await channel_->async_send(bytes, no_descriptors, limit);
    if (!sent) {
        creates_.erase(request.request_id);
        co_return std::move(sent).error();
    }
    const auto outcome = co_await pending->done.async_wait(limit);
    if (pending->outcome) {
        creates_.erase(request.request_id);
        co_return std::move(*pending->outcome);
    }
    pending->abandoned = true;  // the answer, when it comes, is destroyed by dispatch()
    if (outcome == async_event::wait_outcome::cancelled) {
        co_return make_error(errc::cancelled, "create was cancelled before the helper answered");
    }
    co_return make_error(errc::deadline_exceeded,
                         "the sandbox helper did not answer create in time");
}

asio::awaitable<result<void>> helper_client::async_destroy(std::string sandbox_id, deadline limit) {
    if (phase_ != phase::running) {
        co_return make_error(errc::backend_failure, "the sandbox helper is not running");
    }
    auto message = wire::make_message<wire::destroy_message>(wire::message_type::destroy);
    wire::copy_field(message.sandbox_id, sandbox_id);
    const auto bytes = std::as_bytes(std::span(&message, 1));
    const std::span<const int> no_descriptors;  // a named local (g++ 12)
    co_return co_await channel_->async_send(bytes, no_descriptors, limit);
}

asio::awaitable<void> helper_client::read_loop() {
    auto self = shared_from_this();
    while (channel_ && channel_->is_open()) {
        auto record = co_await channel_->async_receive();
        if (!record) {
            // A cancelled receive is this process stopping (the backend going away), not the
            // helper lost: the same clean-up, without an error in the operator's log.
            const bool stopping = record.error().code == errc::cancelled;
            lose("sandbox helper: " + record.error().to_string(),
                 stopping ? log_level::debug : log_level::error);
            break;
        }
        if (record->data.empty()) {
            lose("the sandbox helper exited");
            break;
        }
        dispatch(*record);
    }
}

void helper_client::dispatch(received_record& record) {
    wire::header h{};
    if (!wire::read_header(record.data, h)) return lose("protocol error: malformed helper record");
    switch (static_cast<wire::message_type>(h.type)) {
        case wire::message_type::hello: {
            wire::hello_message m{};
            if (!wire::read_fixed(record.data, wire::message_type::hello, m) ||
                m.version != wire::protocol_version) {
                return lose("protocol error: the sandbox helper speaks another protocol version");
            }
            host_layers_ = m.host_layers;
            layer_detail_ = std::string(wire::read_field(m.layer_detail));
            setup_error_.reset();
            if (m.setup_error != 0) {
                // Unusable on this host as it is set up: not a failure a retry can fix.
                auto code = static_cast<errc>(m.setup_error);
                if (m.setup_error < 1 || m.setup_error > static_cast<int>(errc::too_large) ||
                    code == errc::backend_failure || code == errc::limit_exceeded) {
                    code = errc::layer_unavailable;
                }
                setup_error_ = make_error(code, layer_detail_);
            }
            phase_ = phase::running;
            if (started_) started_->set();
            return;
        }
        case wire::message_type::created: {
            wire::created_message m{};
            if (!wire::read_fixed(record.data, wire::message_type::created, m) ||
                (record.fds.size() != 2 && !record.descriptors_lost)) {
                return lose("protocol error: malformed created record");
            }
            auto it = creates_.find(m.request_id);
            if (it == creates_.end()) return lose("protocol error: created answers no request");
            if (it->second->abandoned || record.descriptors_lost) {
                // Its creator gave up waiting: destroy it at once (the reap is reported as usual).
                auto destroy =
                    wire::make_message<wire::destroy_message>(wire::message_type::destroy);
                wire::copy_field(destroy.sandbox_id, it->second->sandbox_id);
                (void)channel_->try_send(std::as_bytes(std::span(&destroy, 1)));
                if (record.descriptors_lost) {
                    // This process is out of descriptors: fail this create, not the helper.
                    it->second->outcome.emplace(make_error(
                        errc::limit_exceeded,
                        "the application is out of file descriptors (RLIMIT_NOFILE): each "
                        "sandbox needs 3 and each running command 3"));
                    it->second->done.set();
                }
                creates_.erase(it);
                return;
            }
            created_sandbox made;
            made.message = m;
            made.pidfd = std::move(record.fds[0]);
            made.control = std::move(record.fds[1]);
            it->second->outcome.emplace(std::move(made));
            it->second->done.set();
            return;
        }
        case wire::message_type::create_failed: {
            wire::create_failed_message m{};
            if (!wire::read_fixed(record.data, wire::message_type::create_failed, m)) {
                return lose("protocol error: malformed create_failed record");
            }
            auto it = creates_.find(m.request_id);
            if (it == creates_.end())
                return lose("protocol error: create_failed answers no request");
            if (it->second->abandoned) {
                creates_.erase(it);
                return;
            }
            auto code = static_cast<errc>(m.error_code);
            if (m.error_code < 1 || m.error_code > static_cast<int>(errc::too_large)) {
                code = errc::backend_failure;
            }
            std::string detail(wire::read_field(m.detail));
            it->second->outcome.emplace(make_error(code, std::move(detail)));
            it->second->done.set();
            return;
        }
        case wire::message_type::reaped: {
            wire::reaped_message m{};
            if (!wire::read_fixed(record.data, wire::message_type::reaped, m)) {
                return lose("protocol error: malformed reaped record");
            }
            if (on_reaped) on_reaped(m);
            return;
        }
        default:
            return lose("protocol error: unexpected record type " + std::to_string(h.type));
    }
}

void helper_client::lose(const std::string& reason, log_level level) {
    if (phase_ == phase::stopped) return;
    detail::log(level, "helper", reason);
    if (phase_ == phase::starting) start_error_ = make_error(errc::backend_failure, reason);
    phase_ = phase::stopped;
    if (channel_) channel_->close();
    for (auto& [id, pending] : creates_) {
        pending->outcome.emplace(make_error(errc::backend_failure, reason));
        pending->done.set();
    }
    creates_.clear();
    if (started_) started_->set();
    // Never block the executor here: kill the helper and reap it from a task.
    if (pidfd_.is_open()) {
        ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
        tasks_.spawn(reap_helper(executor_, std::move(pidfd_)));
    }
    if (on_helper_lost) on_helper_lost(reason);
}

void helper_client::shutdown() noexcept {
    if (channel_) channel_->close();
    if (!pidfd_.is_open()) return;
    // EOF on its socket makes the helper kill its sandboxes and exit; give it a moment.
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0)
        ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
    // Reap it, but not at any price: a process stuck in the kernel, or a traced one (whose exit
    // only its tracer sees until it lets go), would hold the application's thread for ever.
    constexpr int reap_bound_ms = 2000;
    bool reaped = false;
    for (int waited_ms = 0;; waited_ms += 10) {
        siginfo_t info{};
        const int rc = ::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG);
        // The application may reap children itself (or ignore SIGCHLD); ECHILD is fine then.
        if ((rc == 0 && info.si_pid != 0) || (rc != 0 && errno != EINTR)) {
            reaped = true;
            break;
        }
        if (waited_ms >= reap_bound_ms) break;
        const timespec pause{0, 10'000'000};
        ::nanosleep(&pause, nullptr);
    }
    if (!reaped) {
        detail::log(log_level::error, "helper",
                    "the sandbox helper (pid " + std::to_string(pid_of(pidfd_.get())) +
                        ") was not reaped within " + std::to_string(reap_bound_ms) +
                        " ms of its kill; moat stops waiting for it");
    }
    pidfd_.reset();
}

}  // namespace moat
