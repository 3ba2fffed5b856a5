#include "support/fault_injecting_backend.hpp"

#include "core/async_event.hpp"

#include <memory>

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

}  // namespace

asio::awaitable<result<exec_result>> fault_injecting_backend::async_exec(std::string id,
                                                                         exec_request request) {
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

}  // namespace moat::test
