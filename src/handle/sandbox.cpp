#include <moat/log.hpp>
#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>
#include <moat/with_timeout.hpp>

#include "core/async_event.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "handle/operation_queue.hpp"
#include "handle/sandbox_impl.hpp"
#include "handle/sandbox_run.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <tuple>
#include <type_traits>

namespace moat {
namespace {

// An exec_stream that holds its sandbox's turn until the stream ends or is dropped, under the
// caller's deadline.
class handle_stream final : public exec_stream::impl {
  public:
    handle_stream(std::shared_ptr<sandbox::impl> owner, sandbox::impl::held_turn turn,
                  exec_stream inner, deadline limit)
        : owner_(std::move(owner)),
          turn_(std::move(turn)),
          inner_(std::move(inner)),
          limit_(limit) {}
    ~handle_stream() override {
        inner_ = exec_stream();  // kills the program if it still runs
        turn_.release();
    }

    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override {
        return guarded(next(this));
    }

  private:
    static asio::awaitable<result<std::variant<output_chunk, exec_result>>> next(
        handle_stream* self) {
        if (self->finished_) co_return make_error(errc::invalid_argument, "the stream has ended");
        std::exception_ptr failure;
        result<std::variant<output_chunk, exec_result>> pulled =
            make_error(errc::cancelled, "not pulled");
        try {
            auto pull = self->inner_.async_next();
            pulled = co_await with_timeout(std::move(pull), self->limit_);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) {
            // Thrown before the pull reached the program (a cancellation already pending): stop
            // the program here, as a cancelled pull would have.
            self->inner_ = exec_stream();
            pulled = error_from_exception(failure);
        }
        if (!pulled) {
            self->finish();
            if (is_quarantine_cause(pulled.error())) self->owner_->quarantine(pulled.error());
            co_return pulled;
        }
        if (std::holds_alternative<exec_result>(*pulled)) self->finish();
        co_return pulled;
    }

    void finish() {
        finished_ = true;
        turn_.release();
    }

    std::shared_ptr<sandbox::impl> owner_;
    sandbox::impl::held_turn turn_;
    exec_stream inner_;
    deadline limit_;
    bool finished_ = false;
};

// "N ms" / "N s" for a message.
std::string duration_text(std::chrono::milliseconds d) {
    if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
    return std::to_string(d.count()) + " ms";
}

// A file_read_stream that holds its place in its lane until its last chunk, a failed pull, its
// drop, or a stall (no pull for transfer_stall_limit: a timer closes it and gives the place up),
// under the caller's deadline. File errors on the way are the caller's (per-path), so only a
// sandbox that went away quarantines.
class handle_file_stream final : public file_read_stream::impl {
  public:
    handle_file_stream(std::shared_ptr<sandbox::impl> owner, sandbox::impl::held_turn turn,
                       file_read_stream inner, deadline limit)
        : core_(
              std::make_shared<core>(std::move(owner), std::move(turn), std::move(inner), limit)) {
        arm(core_);
    }
    ~handle_file_stream() override { core_->finish(); }

    asio::awaitable<result<std::string>> async_next() override { return guarded(next(core_)); }

  private:
    // What the stall timer may touch: the timer's handler holds it weakly, so a stream dropped
    // while the handler is queued is never reached.
    struct core {
        core(std::shared_ptr<sandbox::impl> o, sandbox::impl::held_turn t, file_read_stream i,
             deadline l)
            : owner(std::move(o)),
              turn(std::move(t)),
              inner(std::move(i)),
              limit(l),
              stall_timer(owner->executor) {}
        void finish() {
            finished = true;
            stall_timer.cancel();
            inner = file_read_stream();
            turn.release();
        }
        std::shared_ptr<sandbox::impl> owner;
        sandbox::impl::held_turn turn;
        file_read_stream inner;
        deadline limit;
        asio::steady_timer stall_timer;
        std::uint64_t pulls = 0;  // the timer's handler knows its arming by this
        bool finished = false;
        bool stalled = false;
    };

    // Closes the stream if nobody pulls it within the stall limit from now.
    static void arm(const std::shared_ptr<core>& c) {
        const auto stall = c->owner->options.transfer_stall_limit;
        if (c->finished || stall <= std::chrono::milliseconds::zero()) return;
        c->stall_timer.expires_after(stall);
        std::weak_ptr<core> weak = c;
        const std::uint64_t armed_at = c->pulls;
        c->stall_timer.async_wait([weak, armed_at](const std::error_code& ec) {
            auto still = weak.lock();
            if (ec || !still || still->finished || still->pulls != armed_at) return;
            still->stalled = true;
            still->finish();
        });
    }

    static asio::awaitable<result<std::string>> next(std::shared_ptr<core> self) {
        if (self->stalled) {
            co_return make_error(
                errc::deadline_exceeded,
                "read_file_stream: nothing was pulled for " +
                    duration_text(self->owner->options.transfer_stall_limit) +
                    " (handle_options::transfer_stall_limit): the stream was closed");
        }
        if (self->finished) co_return make_error(errc::invalid_argument, "the stream has ended");
        ++self->pulls;  // a queued stall handler of the last arming does nothing now
        self->stall_timer.cancel();
        // A pull is one bounded chunk that completes even when its deadline fires meanwhile, so
        // a deadline that has already passed is checked here.
        if (self->limit.has_expired()) {
            self->finish();
            co_return make_error(errc::deadline_exceeded,
                                 "read_file_stream: the deadline passed while the file was read");
        }
        std::exception_ptr failure;
        result<std::string> pulled = make_error(errc::cancelled, "not pulled");
        try {
            auto pull = self->inner.async_next();
            pulled = co_await with_timeout(std::move(pull), self->limit);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) pulled = error_from_exception(failure);
        if (!pulled) {
            self->finish();
            const errc code = static_cast<errc>(pulled.error().code.value());
            if (code == errc::sandbox_unavailable || code == errc::sandbox_not_found) {
                self->owner->quarantine(pulled.error());
            }
            co_return pulled;
        }
        if (pulled->empty()) {
            self->finish();
        } else {
            arm(self);
        }
        co_return pulled;
    }

    std::shared_ptr<core> core_;
};

// A write's byte_source under the stall limit: each call must yield within it, or the write
// fails with deadline_exceeded (and the backend abandons it, removing its temporary file).
struct stall_bounded_source {
    byte_source inner;
    std::chrono::milliseconds stall;

    asio::awaitable<result<std::string>> operator()() const { return pull(inner, stall); }

    static asio::awaitable<result<std::string>> pull(byte_source inner,
                                                     std::chrono::milliseconds stall) {
        if (stall <= std::chrono::milliseconds::zero()) co_return co_await inner();
        const auto limit = deadline::after(stall);
        auto call = inner();
        auto got = co_await with_timeout(std::move(call), limit);
        if (!got && got.error().code == errc::deadline_exceeded && limit.has_expired()) {
            co_return make_error(errc::deadline_exceeded,
                                 "write_file_stream: the source gave nothing for " +
                                     duration_text(stall) +
                                     " (handle_options::transfer_stall_limit)");
        }
        co_return got;
    }
};

asio::awaitable<void> destroy_in_background(std::shared_ptr<sandbox::impl> self) {
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await sandbox::impl::destroy_now(self);
    if (!destroyed) {
        detail::log(log_level::error, "sandbox", destroyed.error().to_string(), self->info.id);
    }
}

}  // namespace

const char* to_string(handle_state state) noexcept {
    switch (state) {
        case handle_state::ready:
            return "ready";
        case handle_state::busy:
            return "busy";
        case handle_state::quarantined:
            return "quarantined";
        case handle_state::destroying:
            return "destroying";
        case handle_state::destroyed:
            return "destroyed";
        case handle_state::destroy_failed:
            return "destroy_failed";
    }
    return "unknown";
}

sandbox::impl::impl(backend& b, sandbox_info i, handle_options o, std::function<void()> ended_hook,
                    std::shared_ptr<moat::telemetry> t)
    : sandboxes(b),
      executor(b.get_executor()),
      info(std::move(i)),
      options(o),
      queue(executor),
      side_queue(executor, options.side_lane_width),
      tasks(executor, "sandbox " + info.id),
      ended(executor),
      on_end(std::move(ended_hook)),
      telemetry(std::move(t)) {}

void sandbox::impl::report(const char* what, std::optional<errc> failure,
                           std::chrono::steady_clock::time_point called,
                           std::chrono::steady_clock::time_point granted) {
    if (!telemetry) return;
    operation_event e;
    e.sandbox_id = info.id;
    e.operation = what;
    e.operation_id = telemetry->next_operation_id++;
    e.error = failure;
    e.queued = granted - called;
    e.ran = std::chrono::steady_clock::now() - granted;
    if (e.queued.count() > 0) telemetry->metrics.queue_wait.record(e.queued);
    telemetry->record(e);
}

std::chrono::milliseconds sandbox::impl::stop_bound() const {
    return sandboxes.stop_grace() + options.kill_grace;
}

std::optional<error> sandbox::impl::refusal() const {
    if (backend_gone) {
        return make_error(errc::sandbox_unavailable,
                          "sandbox " + info.id + ": its runtime was destroyed");
    }
    if (state == handle_state::ready || state == handle_state::busy) return std::nullopt;
    if (cause) {
        return make_error(errc::sandbox_unavailable,
                          "sandbox " + info.id + " is quarantined: " + cause->to_string());
    }
    return make_error(errc::sandbox_unavailable, "sandbox " + info.id + " was destroyed");
}

void sandbox::impl::quarantine(const error& why) {
    if (state != handle_state::ready && state != handle_state::busy) return;
    detail::log(log_level::warning, "sandbox", "quarantined: " + why.to_string(), info.id);
    state = handle_state::quarantined;
    cause = why;
    close_forwards();
    if (telemetry) ++telemetry->metrics.quarantines;
    queue.refuse_all();
    side_queue.refuse_all();
    tasks.spawn(destroy_in_background(shared_from_this()));
}

asio::awaitable<result<sandbox::impl::held_turn>> sandbox::impl::acquire_turn(
    std::shared_ptr<impl> self, const char* what, deadline limit, moat::lane in) {
    if (auto refused = self->refusal()) co_return std::move(*refused);
    const auto turn = co_await self->queue_of(in).async_acquire(limit);
    if (turn == operation_queue::turn::cancelled) {
        co_return make_error(errc::cancelled, std::string(what) + " was cancelled while queued");
    }
    if (turn == operation_queue::turn::deadline_passed) {
        co_return make_error(errc::deadline_exceeded,
                             std::string(what) + ": the deadline passed while it was queued");
    }
    if (turn == operation_queue::turn::refused) {
        if (auto refused = self->refusal()) co_return std::move(*refused);
        co_return make_error(errc::sandbox_unavailable,
                             "sandbox " + self->info.id + " was destroyed");
    }
    held_turn held(self, in);
    if (auto refused = self->refusal()) co_return std::move(*refused);  // `held` hands it on
    if (in == moat::lane::ordered) self->state = handle_state::busy;
    auto running = co_await unpause_for(self, what, limit);
    if (!running) co_return std::move(running).error();
    co_return std::move(held);
}

void sandbox::impl::end_turn(moat::lane in) {
    queue_of(in).release();
    if (in == moat::lane::ordered && state == handle_state::busy) state = handle_state::ready;
}

asio::awaitable<result<void>> sandbox::impl::destroy_now(std::shared_ptr<impl> self) {
    if (self->state != handle_state::destroying && !self->ended.is_set()) {
        self->state = handle_state::destroying;
        self->close_forwards();
        self->queue.refuse_all();
        self->side_queue.refuse_all();
        for (const auto task : self->running_tasks) self->tasks.cancel(task);
        self->tasks.spawn(destroy_once(self));
    }
    // Cancellation is consumed by each wait and ignored: the destroy is bounded by the backend.
    while (!self->ended.is_set()) co_await self->ended.async_wait(deadline::never());
    co_return *self->destroy_outcome;
}

asio::awaitable<void> sandbox::impl::destroy_once(std::shared_ptr<impl> self) {
    co_await asio::this_coro::reset_cancellation_state();
    const auto started = std::chrono::steady_clock::now();
    result<void> destroyed;
    if (self->backend_gone) {
        destroyed = make_error(errc::sandbox_unavailable,
                               "sandbox " + self->info.id + ": its runtime was destroyed first");
    } else {
        auto destroying = guarded(self->sandboxes.async_destroy(self->info.id));
        destroyed = co_await std::move(destroying);
        // Gone from the backend already (someone else destroyed it and the record went): absence
        // is what was asked for.
        if (!destroyed && destroyed.error().code == errc::sandbox_not_found) destroyed = {};
    }
    self->state = destroyed ? handle_state::destroyed : handle_state::destroy_failed;
    self->destroy_outcome = destroyed;
    std::optional<errc> failure;
    if (!destroyed) failure = failure_of(destroyed.error());
    if (!self->backend_gone) self->report("destroy", failure, started, started);
    self->ended.set();
    if (self->on_end) std::exchange(self->on_end, nullptr)();
}

sandbox::~sandbox() {
    if (!impl_) return;
    impl_->close_forwards();
    if (impl_->state != handle_state::ready && impl_->state != handle_state::busy) return;
    if (impl_->detach_on_drop) {
        if (impl_->on_end) std::exchange(impl_->on_end, nullptr)();
        return;
    }
    impl_->tasks.spawn(destroy_in_background(impl_));
}

const std::string& sandbox::id() const noexcept {
    return impl_->info.id;
}
const sandbox_info& sandbox::info() const noexcept {
    return impl_->info;
}
handle_state sandbox::state() const noexcept {
    return impl_->state;
}
const std::optional<error>& sandbox::quarantine_cause() const noexcept {
    return impl_->cause;
}
std::size_t sandbox::queued() const noexcept {
    return impl_->queue.waiting() + impl_->side_queue.waiting();
}
std::size_t sandbox::running_beside() const noexcept {
    return impl_->side_queue.running();
}

// Each public operation is a plain function: it binds the shared state now (the handle may be
// dropped before the awaitable is awaited) and puts the one exception boundary (guarded) on top.

asio::awaitable<result<exec_result>> sandbox::async_exec(exec_request request, deadline limit,
                                                         lane in) {
    return run_call(impl_, "exec", limit, in, &backend::async_exec, std::move(request));
}

asio::awaitable<result<std::vector<file_write_result>>> sandbox::async_write_files(
    std::vector<file_write> files, deadline limit, lane in) {
    return run_call(impl_, "write_files", limit, in, &backend::async_write_files, std::move(files));
}

asio::awaitable<result<std::vector<file_read_result>>> sandbox::async_read_files(
    std::vector<std::string> paths, deadline limit, lane in) {
    return run_call(impl_, "read_files", limit, in, &backend::async_read_files, std::move(paths));
}

asio::awaitable<result<file_write_result>> sandbox::async_write_file_stream(
    file_write_target target, byte_source given, deadline limit, lane in) {
    byte_source source =
        stall_bounded_source{std::move(given), impl_->options.transfer_stall_limit};
    return run_call(impl_, "write_file_stream", limit, in, &backend::async_write_file_stream,
                    std::move(target), std::move(source));
}

asio::awaitable<result<std::vector<file_metadata_result>>> sandbox::async_read_metadata(
    std::vector<std::string> paths, deadline limit, lane in) {
    return run_call(impl_, "read_metadata", limit, in, &backend::async_read_metadata,
                    std::move(paths));
}

asio::awaitable<result<file_stat>> sandbox::async_stat(std::string path, deadline limit, lane in) {
    return run_call(impl_, "stat", limit, in, &backend::async_stat, std::move(path));
}

asio::awaitable<result<std::vector<dir_entry>>> sandbox::async_list_dir(std::string path,
                                                                        deadline limit, lane in) {
    return run_call(impl_, "list_dir", limit, in, &backend::async_list_dir, std::move(path));
}

asio::awaitable<result<asio::ip::tcp::socket>> connect_port_call(
    std::shared_ptr<sandbox::impl> state, std::uint16_t port, deadline limit, lane in) {
    return run_call(std::move(state), "connect_port", limit, in, &backend::async_connect_port,
                    port);
}

asio::awaitable<result<asio::ip::tcp::socket>> sandbox::async_connect_port(std::uint16_t port,
                                                                           deadline limit,
                                                                           lane in) {
    return connect_port_call(impl_, port, limit, in);
}

asio::awaitable<result<asio::local::stream_protocol::socket>> sandbox::async_connect_unix(
    std::string path, deadline limit, lane in) {
    return run_call(impl_, "connect_unix", limit, in, &backend::async_connect_unix,
                    std::move(path));
}

asio::awaitable<result<sandbox_usage>> sandbox::async_usage(deadline limit, lane in) {
    return run_call(impl_, "usage", limit, in, &backend::async_usage);
}

asio::awaitable<result<dir_watch>> watch_dir_call(std::shared_ptr<sandbox::impl> state,
                                                  std::string path, watch_options options,
                                                  deadline limit, lane in) {
    return run_call(std::move(state), "watch_dir", limit, in, &backend::async_watch_dir,
                    std::move(path), options);
}

asio::awaitable<result<sandbox_info>> update_network_call(std::shared_ptr<sandbox::impl> state,
                                                          sandbox_network network, deadline limit,
                                                          lane in) {
    return run_call(std::move(state), "update_network", limit, in, &backend::async_update_network,
                    std::move(network));
}

asio::awaitable<result<sandbox_info>> sandbox::async_extend_ttl(std::chrono::milliseconds ttl,
                                                                deadline limit) {
    return run_call(impl_, "extend_ttl", limit, lane::ordered, &backend::async_extend_ttl, ttl);
}

namespace {

asio::awaitable<result<exec_stream>> start_stream(std::shared_ptr<sandbox::impl> state,
                                                  exec_request request, deadline limit, lane in) {
    const auto called = std::chrono::steady_clock::now();
    auto turn = co_await sandbox::impl::acquire_turn(state, "exec_stream", limit, in);
    const auto granted = std::chrono::steady_clock::now();
    if (!turn) {
        state->report("exec_stream", failure_of(turn.error()), called, granted);
        co_return std::move(turn).error();
    }
    std::function<asio::awaitable<result<exec_stream>>()> start = [state, request]() mutable {
        return state->sandboxes.async_exec_stream(state->info.id, std::move(request));
    };
    auto started =
        co_await sandbox::impl::run_in_turn<exec_stream>(state, "exec_stream", limit, start);
    std::optional<errc> failure;
    if (!started) failure = failure_of(started.error());
    state->report("exec_stream", failure, called, granted);  // the start; the stream runs on
    if (!started) co_return std::move(started).error();      // `turn` hands the queue on
    // The stream holds the turn from here until it ends or is dropped.
    auto wrapped =
        std::make_unique<handle_stream>(state, std::move(*turn), std::move(*started), limit);
    co_return exec_stream(std::move(wrapped));
}

asio::awaitable<result<file_read_stream>> start_file_stream(std::shared_ptr<sandbox::impl> state,
                                                            std::string path, deadline limit,
                                                            lane in) {
    const char* what = "read_file_stream";
    const auto called = std::chrono::steady_clock::now();
    auto turn = co_await sandbox::impl::acquire_turn(state, what, limit, in);
    const auto granted = std::chrono::steady_clock::now();
    if (!turn) {
        state->report(what, failure_of(turn.error()), called, granted);
        co_return std::move(turn).error();
    }
    std::function<asio::awaitable<result<file_read_stream>>()> start = [state, path]() mutable {
        return state->sandboxes.async_read_file_stream(state->info.id, std::move(path));
    };
    auto opened = co_await sandbox::impl::run_in_turn<file_read_stream>(state, what, limit, start);
    std::optional<errc> failure;
    if (!opened) failure = failure_of(opened.error());
    state->report(what, failure, called, granted);  // the open; the stream runs on
    if (!opened) co_return std::move(opened).error();
    file_stat info = opened->stat();
    auto wrapped =
        std::make_unique<handle_file_stream>(state, std::move(*turn), std::move(*opened), limit);
    co_return file_read_stream(std::move(info), std::move(wrapped));
}

asio::awaitable<result<void>> destroy_and_wait(std::shared_ptr<sandbox::impl> state) {
    co_await asio::this_coro::reset_cancellation_state();
    co_return co_await sandbox::impl::destroy_now(std::move(state));
}

}  // namespace

asio::awaitable<result<exec_stream>> sandbox::async_exec_stream(exec_request request,
                                                                deadline limit, lane in) {
    return guarded(start_stream(impl_, std::move(request), limit, in));
}

asio::awaitable<result<file_read_stream>> sandbox::async_read_file_stream(std::string path,
                                                                          deadline limit, lane in) {
    return guarded(start_file_stream(impl_, std::move(path), limit, in));
}

asio::awaitable<result<process>> sandbox::async_spawn(exec_request request, deadline limit,
                                                      lane in) {
    return run_call(impl_, "spawn", limit, in, &backend::async_spawn, std::move(request));
}

asio::awaitable<result<terminal>> sandbox::async_open_terminal(exec_request request,
                                                               terminal_size size, deadline limit,
                                                               lane in) {
    return run_call(impl_, "open_terminal", limit, in, &backend::async_open_terminal,
                    std::move(request), size);
}

asio::awaitable<result<terminal>> sandbox::async_attach_terminal(int pid, deadline limit, lane in) {
    return run_call(impl_, "attach_terminal", limit, in, &backend::async_attach_terminal, pid);
}

asio::awaitable<result<void>> sandbox::async_destroy() {
    return guarded(destroy_and_wait(impl_));
}

}  // namespace moat
