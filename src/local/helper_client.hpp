// The library's side of the moat-sandboxd helper: starts it on first use (single flight), sends
// create and destroy requests, and dispatches what it reports (created, create_failed, reaped).
// Confined to the backend's executor.
#pragma once

#include <moat/deadline.hpp>
#include <moat/local_backend.hpp>
#include <moat/log.hpp>
#include <moat/result.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "core/unique_fd.hpp"
#include "local/seqpacket_channel.hpp"
#include "wire/protocol.hpp"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace moat {

struct created_sandbox {
    wire::created_message message{};
    unique_fd pidfd;
    unique_fd control;
};

class helper_client : public std::enable_shared_from_this<helper_client> {
  public:
    helper_client(asio::any_io_executor executor, task_group& tasks, local_options options);
    ~helper_client();

    // Starts the helper if it is not running and waits for its hello. Single flight: concurrent
    // callers share one start.
    asio::awaitable<result<void>> async_ensure_started(deadline limit);

    // Asks the helper to create a sandbox and waits for its answer. Cancellation: none (the answer
    // is awaited within `limit` so that the caller can destroy what was made).
    asio::awaitable<result<created_sandbox>> async_create(wire::create_message request,
                                                          deadline limit);

    // Asks the helper to kill and reap a sandbox; the outcome arrives through on_reaped. Fails if
    // the request cannot be sent by `limit`.
    asio::awaitable<result<void>> async_destroy(std::string sandbox_id, deadline limit);

    // Called for every reaped sandbox (destroyed, TTL, crashed).
    std::function<void(const wire::reaped_message&)> on_reaped;
    // Called when the helper is gone; every sandbox it held is gone with it.
    std::function<void(const std::string& reason)> on_helper_lost;

    std::uint32_t host_layers() const noexcept { return host_layers_; }
    // Why the running helper cannot create any sandbox (its setup failed), or nullopt.
    const std::optional<error>& setup_error() const noexcept { return setup_error_; }
    const std::string& layer_detail() const noexcept { return layer_detail_; }

    // Closes the control socket (the helper then kills its sandboxes and exits) and reaps it:
    // ~2 s for it to exit, then SIGKILL and at most ~2 s more to reap it, then it gives up with
    // an error logged (a helper stuck in the kernel, or one whose exit only a tracer can see).
    // Synchronous: used on backend destruction.
    void shutdown() noexcept;

  private:
    struct pending_create {
        explicit pending_create(const asio::any_io_executor& ex) : done(ex) {}
        async_event done;
        std::optional<result<created_sandbox>> outcome;
        std::string sandbox_id;
        bool abandoned = false;
    };

    friend asio::awaitable<void> run_helper_reader(std::shared_ptr<helper_client> self);
    asio::awaitable<void> read_loop();
    void dispatch(received_record& record);
    void lose(const std::string& reason, log_level level = log_level::error);

    asio::any_io_executor executor_;
    task_group& tasks_;
    local_options options_;
    enum class phase { stopped, starting, running } phase_ = phase::stopped;
    std::shared_ptr<async_event> started_;  // set when a start attempt finishes
    std::optional<error> start_error_;
    std::unique_ptr<seqpacket_channel> channel_;
    unique_fd pidfd_;
    std::uint32_t host_layers_ = 0;
    std::string layer_detail_;
    std::optional<error> setup_error_;
    std::uint64_t next_request_ = 1;
    std::map<std::uint64_t, std::shared_ptr<pending_create>> creates_;
};

}  // namespace moat
