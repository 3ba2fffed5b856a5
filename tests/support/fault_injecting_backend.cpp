#include "support/fault_injecting_backend.hpp"

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <memory>
#include <utility>

namespace moat::test {
namespace {

struct shielded_exec {
    explicit shielded_exec(const asio::any_io_executor& ex) : done(ex) {}
    async_event done;
    std::optional<result<exec_result>> outcome;
};

asio::awaitable<void> run_shielded(std::shared_ptr<shielded_exec> state,
                                   asio::awaitable<result<exec_result>> operation) {
    state->outcome = co_await std::move(operation);
    state->done.set();
}

// Waits out `delay` whatever cancellations arrive meanwhile.
asio::awaitable<void> sleep_uncancellable(std::chrono::milliseconds delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
        timer.expires_at(until);
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_await asio::this_coro::reset_cancellation_state();
    }
}

}  // namespace

asio::awaitable<result<exec_result>> fault_injecting_backend::async_exec(std::string id,
                                                                         exec_request request) {
    if (stop_delay.count() > 0) {
        auto state = std::make_shared<shielded_exec>(real_.get_executor());
        auto operation = real_.async_exec(std::move(id), std::move(request));
        const auto task = shielded_.spawn(run_shielded(state, std::move(operation)));
        const auto waited = co_await state->done.async_wait(deadline::never());
        if (waited == async_event::wait_outcome::cancelled) {
            co_await sleep_uncancellable(stop_delay);
            shielded_.cancel(task);
        }
        while (!state->done.is_set()) co_await state->done.async_wait(deadline::never());
        co_return std::move(*state->outcome);
    }
    if (!lose_kills) {
        auto outcome = co_await real_.async_exec(std::move(id), std::move(request));
        if (fail_next_exec) {
            auto injected = std::move(*fail_next_exec);
            fail_next_exec.reset();
            co_return injected;
        }
        co_return outcome;
    }
    // The real exec runs where the caller's cancellation cannot reach it: the kill is "lost".
    auto state = std::make_shared<shielded_exec>(real_.get_executor());
    auto operation = real_.async_exec(std::move(id), std::move(request));
    shielded_.spawn(run_shielded(state, std::move(operation)));
    while (!state->done.is_set()) {
        // A cancellation is reported, and ignored: the wait starts again.
        co_await state->done.async_wait(deadline::never());
    }
    co_return std::move(*state->outcome);
}

asio::awaitable<result<void>> fault_injecting_backend::async_destroy(std::string id) {
    ++destroys;
    if (auto gate = destroy_gate) {
        const auto forever = deadline::never();
        while (!gate->is_set()) (void)co_await gate->async_wait(forever);
    }
    if (failing_destroys > 0) {
        --failing_destroys;
        co_return make_error(errc::backend_failure,
                             "injected: the destroy of " + id + " was not confirmed");
    }
    co_return co_await real_.async_destroy(std::move(id));
}

asio::awaitable<result<exec_stream>> fault_injecting_backend::async_exec_stream(
    std::string id, exec_request request) {
    auto started = co_await real_.async_exec_stream(std::move(id), std::move(request));
    if (started && on_stream_started) std::exchange(on_stream_started, nullptr)();
    co_return started;
}

}  // namespace moat::test
