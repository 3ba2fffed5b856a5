// A backend decorator for the faults the real local backend cannot produce on demand: a kill
// request that is lost (the operation never learns it was cancelled), a transport or protocol
// failure in the middle of an operation, a destroy that fails and leaves the sandbox running, and
// a destroy held until the test lets it go. Everything else goes to the real backend it wraps.
#pragma once

#include <moat/backend.hpp>
#include <moat/task_group.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

namespace moat {
class async_event;
}

namespace moat::test {

class fault_injecting_backend final : public backend {
  public:
    explicit fault_injecting_backend(backend& real)
        : real_(real), shielded_(real.get_executor(), "fault injection") {}

    // The next exec fails with this error (after the real command ran to completion), once.
    std::optional<error> fail_next_exec;
    // The next create fails with this error without reaching the real backend, once.
    std::optional<error> fail_next_create;
    // Execs ignore their caller's cancellation and deadline: the real command runs on until it
    // ends on its own or its sandbox is destroyed.
    bool lose_kills = false;
    // A caller's cancellation reaches the real exec this much later (a slow transport between the
    // handle and the backend); stop_grace() counts the delay, as a real backend with such a hop
    // would.
    std::chrono::milliseconds stop_delay{0};
    // Called once, synchronously, when the next real stream has started and before the caller
    // learns of it: the exact point where a caller's cancellation races a command's start.
    std::function<void()> on_stream_started;
    // The streaming file calls use backend's batch fallback, as a backend that cannot stream.
    bool batch_files_only = false;
    // The next this many destroys fail with backend_failure without reaching the real backend:
    // the sandbox runs on, as when the backend cannot confirm a destroy.
    std::size_t failing_destroys = 0;
    // While set, a destroy waits for this event before it goes on (to fail or to the real backend).
    std::shared_ptr<async_event> destroy_gate;
    // Destroys that reached this backend (held, failed or passed on).
    std::size_t destroys = 0;

    asio::any_io_executor get_executor() const override { return real_.get_executor(); }
    std::string name() const override { return "fault-injecting " + real_.name(); }
    std::chrono::milliseconds stop_grace() const override {
        return real_.stop_grace() + stop_delay;
    }
    sandbox_layout layout_for(const sandbox_layout& requested) const override {
        return real_.layout_for(requested);
    }
    asio::awaitable<result<sandbox_info>> async_create(sandbox_spec spec) override {
        if (fail_next_create) {
            auto why = std::move(*fail_next_create);
            fail_next_create.reset();
            return failed_create(std::move(why));
        }
        return real_.async_create(std::move(spec));
    }
    asio::awaitable<result<host_report>> async_host_report() override {
        return real_.async_host_report();
    }
    asio::awaitable<result<std::vector<janitor_action>>> async_janitor(bool dry_run) override {
        return real_.async_janitor(dry_run);
    }
    asio::awaitable<result<sandbox_info>> async_attach(std::string id) override {
        return real_.async_attach(std::move(id));
    }
    asio::awaitable<result<sandbox_info>> async_inspect(std::string id) override {
        return real_.async_inspect(std::move(id));
    }
    asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) override {
        return real_.async_list(std::move(filter));
    }
    asio::awaitable<result<sandbox_info>> async_extend_ttl(std::string id,
                                                           std::chrono::milliseconds ttl) override {
        return real_.async_extend_ttl(std::move(id), ttl);
    }
    asio::awaitable<result<void>> async_destroy(std::string id) override;
    asio::awaitable<result<exec_result>> async_exec(std::string id, exec_request request) override;
    asio::awaitable<result<exec_stream>> async_exec_stream(std::string id,
                                                           exec_request request) override;
    asio::awaitable<result<process>> async_spawn(std::string id, exec_request request) override {
        return real_.async_spawn(std::move(id), std::move(request));
    }
    asio::awaitable<result<void>> async_signal(std::string id, std::uint64_t process_id,
                                               int signal) override {
        return real_.async_signal(std::move(id), process_id, signal);
    }
    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::string id, std::vector<file_write> files) override {
        return real_.async_write_files(std::move(id), std::move(files));
    }
    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths) override {
        return real_.async_read_files(std::move(id), std::move(paths));
    }
    asio::awaitable<result<file_write_result>> async_write_file_stream(
        std::string id, file_write_target target, byte_source source) override {
        if (batch_files_only) {
            return backend::async_write_file_stream(std::move(id), std::move(target),
                                                    std::move(source));
        }
        return real_.async_write_file_stream(std::move(id), std::move(target), std::move(source));
    }
    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string id,
                                                                     std::string path) override {
        if (batch_files_only)
            return backend::async_read_file_stream(std::move(id), std::move(path));
        return real_.async_read_file_stream(std::move(id), std::move(path));
    }
    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::string id, std::vector<std::string> paths) override {
        return real_.async_read_metadata(std::move(id), std::move(paths));
    }
    asio::awaitable<result<file_stat>> async_stat(std::string id, std::string path) override {
        return real_.async_stat(std::move(id), std::move(path));
    }
    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string id,
                                                                   std::string path) override {
        return real_.async_list_dir(std::move(id), std::move(path));
    }

  private:
    static asio::awaitable<result<sandbox_info>> failed_create(error why) { co_return why; }

    backend& real_;
    task_group shielded_;  // owns the execs whose kill is "lost"
};

}  // namespace moat::test
