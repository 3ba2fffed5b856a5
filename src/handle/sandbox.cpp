#include <moat/log.hpp>
#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>
#include <moat/with_timeout.hpp>

#include "core/async_event.hpp"
#include "core/exception_boundary.hpp"
#include "handle/operation_queue.hpp"
#include "handle/sandbox_impl.hpp"

#include <asio/this_coro.hpp>

namespace moat {
namespace {

// The failures after which a handle can no longer vouch for its sandbox.
bool is_quarantine_cause(const error& e) {
    return e.code == errc::backend_failure || e.code == errc::protocol_error ||
           e.code == errc::sandbox_unavailable || e.code == errc::sandbox_not_found;
}

template <class T>
struct operation_state {
    explicit operation_state(const asio::any_io_executor& ex) : done(ex) {}
    async_event done;
    std::optional<result<T>> outcome;
};

template <class T>
asio::awaitable<void> run_backend_operation(std::shared_ptr<operation_state<T>> op,
                                            asio::awaitable<result<T>> operation) {
    try {
        op->outcome = co_await std::move(operation);
    } catch (...) {
        op->outcome = error_from_exception(std::current_exception());
    }
    op->done.set();
}

// An exec_stream that holds its sandbox's turn until the stream ends or is dropped, under the
// caller's deadline.
class handle_stream final : public exec_stream::impl {
  public:
    handle_stream(std::shared_ptr<sandbox::impl> owner, exec_stream inner, deadline limit)
        : owner_(std::move(owner)), inner_(std::move(inner)), limit_(limit) {}
    ~handle_stream() override {
        if (finished_) return;
        inner_ = exec_stream();  // kills the program
        owner_->end_turn();
    }

    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override {
        if (finished_) co_return make_error(errc::invalid_argument, "the stream has ended");
        auto pull = inner_.async_next();
        auto next = co_await with_timeout(std::move(pull), limit_);
        if (!next) {
            finish();
            if (is_quarantine_cause(next.error())) owner_->quarantine(next.error());
            co_return next;
        }
        if (std::holds_alternative<exec_result>(*next)) finish();
        co_return next;
    }

  private:
    void finish() {
        finished_ = true;
        owner_->end_turn();
    }

    std::shared_ptr<sandbox::impl> owner_;
    exec_stream inner_;
    deadline limit_;
    bool finished_ = false;
};

asio::awaitable<void> destroy_in_background(std::shared_ptr<sandbox::impl> self) {
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await self->destroy_now();
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
    if (telemetry) ++telemetry->metrics.quarantines;
    queue.refuse_all();
    tasks.spawn(destroy_in_background(shared_from_this()));
}

asio::awaitable<std::optional<error>> sandbox::impl::acquire_turn(const char* what,
                                                                  deadline limit) {
    if (auto refused = refusal()) co_return refused;
    const auto turn = co_await queue.async_acquire(limit);
    if (turn == operation_queue::turn::cancelled) {
        co_return make_error(errc::cancelled, std::string(what) + " was cancelled while queued");
    }
    if (turn == operation_queue::turn::deadline_passed) {
        co_return make_error(errc::deadline_exceeded,
                             std::string(what) + ": the deadline passed while it was queued");
    }
    if (turn == operation_queue::turn::refused) {
        if (auto refused = refusal()) co_return refused;
        co_return make_error(errc::sandbox_unavailable, "sandbox " + info.id + " was destroyed");
    }
    if (auto refused = refusal()) {
        queue.release();
        co_return refused;
    }
    state = handle_state::busy;
    co_return std::nullopt;
}

void sandbox::impl::end_turn() {
    queue.release();
    if (state == handle_state::busy) state = handle_state::ready;
}

template <class T>
asio::awaitable<result<T>> sandbox::impl::run_in_turn(
    const char* what, deadline limit, std::function<asio::awaitable<result<T>>()> start) {
    auto self = shared_from_this();
    auto op = std::make_shared<operation_state<T>>(executor);
    auto operation = start();
    const std::uint64_t task = tasks.spawn(run_backend_operation<T>(op, std::move(operation)));
    running_task = task;
    const auto waited = co_await op->done.async_wait(limit);
    std::optional<errc> stopped_by;
    if (waited == async_event::wait_outcome::cancelled) stopped_by = errc::cancelled;
    if (waited == async_event::wait_outcome::deadline_passed) stopped_by = errc::deadline_exceeded;
    if (stopped_by) {
        // Stop it and wait (not cancellable) for the stop to be confirmed, within the grace.
        tasks.cancel(task);
        const auto grace = deadline::after(options.kill_grace);
        while (!op->done.is_set() && !grace.has_expired()) co_await op->done.async_wait(grace);
    }
    running_task.reset();
    const char* stop_name = stopped_by == errc::cancelled ? "cancellation" : "deadline";
    if (!op->done.is_set()) {
        quarantine(
            make_error(errc::backend_failure, std::string(what) + " did not stop within " +
                                                  std::to_string(options.kill_grace.count()) +
                                                  " ms of its " + stop_name));
        co_return make_error(*stopped_by, std::string(what) + " was stopped (unconfirmed)");
    }
    result<T> outcome = std::move(*op->outcome);
    if (!outcome && is_quarantine_cause(outcome.error())) quarantine(outcome.error());
    if (stopped_by && !outcome && outcome.error().code == errc::cancelled) {
        co_return make_error(*stopped_by, std::string(what) + " was stopped by its " + stop_name +
                                              "; " + outcome.error().detail);
    }
    co_return outcome;
}

template <class T>
asio::awaitable<result<T>> sandbox::impl::run(const char* what, deadline limit,
                                              std::function<asio::awaitable<result<T>>()> start) {
    auto self = shared_from_this();
    const auto called = std::chrono::steady_clock::now();
    auto refused = co_await acquire_turn(what, limit);
    const auto granted = std::chrono::steady_clock::now();
    if (refused) {
        report(what, static_cast<errc>(refused->code.value()), called, granted);
        co_return std::move(*refused);
    }
    auto outcome = co_await run_in_turn<T>(what, limit, start);
    end_turn();
    std::optional<errc> failure;
    if (!outcome) failure = static_cast<errc>(outcome.error().code.value());
    report(what, failure, called, granted);
    co_return outcome;
}

asio::awaitable<result<void>> sandbox::impl::destroy_now() {
    auto self = shared_from_this();
    if (state == handle_state::destroying) {
        while (!ended.is_set()) co_await ended.async_wait(deadline::never());
    }
    if (ended.is_set()) co_return *destroy_outcome;
    if (backend_gone) {
        state = handle_state::destroy_failed;
        destroy_outcome = make_error(errc::sandbox_unavailable,
                                     "sandbox " + info.id + ": its runtime was destroyed first");
        ended.set();
        co_return *destroy_outcome;
    }
    state = handle_state::destroying;
    queue.refuse_all();
    if (running_task) tasks.cancel(*running_task);
    const auto started = std::chrono::steady_clock::now();
    auto destroyed = co_await sandboxes.async_destroy(info.id);
    // Gone from the backend already (someone else destroyed it and the record went): absence is
    // what was asked for.
    if (!destroyed && destroyed.error().code == errc::sandbox_not_found) destroyed = {};
    state = destroyed ? handle_state::destroyed : handle_state::destroy_failed;
    destroy_outcome = destroyed;
    std::optional<errc> failure;
    if (!destroyed) failure = static_cast<errc>(destroyed.error().code.value());
    report("destroy", failure, started, started);
    ended.set();
    if (on_end) on_end();
    co_return destroyed;
}

sandbox::~sandbox() {
    if (!impl_) return;
    if (impl_->state != handle_state::ready && impl_->state != handle_state::busy) return;
    if (impl_->detach_on_drop) {
        if (impl_->on_end) impl_->on_end();
        impl_->on_end = nullptr;
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
    return impl_->queue.waiting();
}

asio::awaitable<result<exec_result>> sandbox::async_exec(exec_request request, deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<exec_result>>()> start = [state, request]() mutable {
        return state->sandboxes.async_exec(state->info.id, std::move(request));
    };
    co_return co_await state->run<exec_result>("exec", limit, start);
}

asio::awaitable<result<std::vector<file_write_result>>> sandbox::async_write_files(
    std::vector<file_write> files, deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<std::vector<file_write_result>>>()> start =
        [state, files]() mutable {
            return state->sandboxes.async_write_files(state->info.id, std::move(files));
        };
    co_return co_await state->run<std::vector<file_write_result>>("write_files", limit, start);
}

asio::awaitable<result<std::vector<file_read_result>>> sandbox::async_read_files(
    std::vector<std::string> paths, deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<std::vector<file_read_result>>>()> start =
        [state, paths]() mutable {
            return state->sandboxes.async_read_files(state->info.id, std::move(paths));
        };
    co_return co_await state->run<std::vector<file_read_result>>("read_files", limit, start);
}

asio::awaitable<result<file_stat>> sandbox::async_stat(std::string path, deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<file_stat>>()> start = [state, path]() mutable {
        return state->sandboxes.async_stat(state->info.id, std::move(path));
    };
    co_return co_await state->run<file_stat>("stat", limit, start);
}

asio::awaitable<result<std::vector<dir_entry>>> sandbox::async_list_dir(std::string path,
                                                                        deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<std::vector<dir_entry>>>()> start = [state,
                                                                              path]() mutable {
        return state->sandboxes.async_list_dir(state->info.id, std::move(path));
    };
    co_return co_await state->run<std::vector<dir_entry>>("list_dir", limit, start);
}

asio::awaitable<result<sandbox_info>> sandbox::async_extend_ttl(std::chrono::milliseconds ttl,
                                                                deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<sandbox_info>>()> start = [state, ttl]() mutable {
        return state->sandboxes.async_extend_ttl(state->info.id, ttl);
    };
    co_return co_await state->run<sandbox_info>("extend_ttl", limit, start);
}

asio::awaitable<result<exec_stream>> sandbox::async_exec_stream(exec_request request,
                                                                deadline limit) {
    auto state = impl_;
    const auto called = std::chrono::steady_clock::now();
    auto refused = co_await state->acquire_turn("exec_stream", limit);
    const auto granted = std::chrono::steady_clock::now();
    if (refused) {
        state->report("exec_stream", static_cast<errc>(refused->code.value()), called, granted);
        co_return std::move(*refused);
    }
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<exec_stream>>()> start = [state, request]() mutable {
        return state->sandboxes.async_exec_stream(state->info.id, std::move(request));
    };
    auto started = co_await state->run_in_turn<exec_stream>("exec_stream", limit, start);
    std::optional<errc> failure;
    if (!started) failure = static_cast<errc>(started.error().code.value());
    state->report("exec_stream", failure, called, granted);  // the start; the stream runs on
    if (!started) {
        state->end_turn();
        co_return std::move(started).error();
    }
    // The stream holds the turn from here until it ends or is dropped.
    auto wrapped = std::make_unique<handle_stream>(state, std::move(*started), limit);
    co_return exec_stream(std::move(wrapped));
}

asio::awaitable<result<process>> sandbox::async_spawn(exec_request request, deadline limit) {
    auto state = impl_;
    // A named local, not a lambda inside the co_await statement (g++ 12; see docs/development.md).
    std::function<asio::awaitable<result<process>>()> start = [state, request]() mutable {
        return state->sandboxes.async_spawn(state->info.id, std::move(request));
    };
    co_return co_await state->run<process>("spawn", limit, start);
}

asio::awaitable<result<void>> sandbox::async_destroy() {
    auto state = impl_;
    co_await asio::this_coro::reset_cancellation_state();
    co_return co_await state->destroy_now();
}

}  // namespace moat
