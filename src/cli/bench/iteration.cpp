#include "cli/bench/iteration.hpp"

#include <moat/task_group.hpp>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

}  // namespace

asio::awaitable<void> one_iteration(runtime& sandboxes, std::chrono::milliseconds delay,
                                    std::shared_ptr<iteration_outcome> out,
                                    std::string template_name) {
    if (delay.count() > 0) {
        asio::steady_timer timer(co_await asio::this_coro::executor, delay);
        co_await timer.async_wait(asio::use_awaitable);
    }
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench";
    spec.template_name = std::move(template_name);
    auto start = clock_type::now();
    auto created = co_await sandboxes.async_create(spec);
    out->create_ms = ms_since(start);
    if (created) {
        auto box = std::move(*created);
        exec_request request;
        request.argv = {"/bin/true"};
        start = clock_type::now();
        auto ran = co_await box->async_exec(request);
        out->exec_ms = ms_since(start);
        start = clock_type::now();
        auto destroyed = co_await box->async_destroy();
        out->destroy_ms = ms_since(start);
        out->ok = ran && ran->exit_code == 0 && destroyed;
    }
    out->done = true;
}

asio::awaitable<std::vector<std::shared_ptr<iteration_outcome>>> run_round(
    runtime& sandboxes, std::size_t count, std::chrono::milliseconds spacing) {
    task_group round_tasks(co_await asio::this_coro::executor, "bench round");
    std::vector<std::shared_ptr<iteration_outcome>> round;
    for (std::size_t i = 0; i < count; ++i) {
        round.push_back(std::make_shared<iteration_outcome>());
        const auto delay = spacing * static_cast<int>(i);
        round_tasks.spawn(one_iteration(sandboxes, delay, round.back()));
    }
    co_await round_tasks.async_wait_all();
    co_return round;
}

runtime_options bench_runtime_options(std::size_t n, std::size_t concurrency) {
    runtime_options options;
    // The bench measures the backend, not admission: let every round through at once.
    options.admission.max_concurrent_creates = concurrency;
    options.admission.creates_per_second = 1e9;
    options.admission.create_burst = n + concurrency;
    options.admission.max_live_sandboxes = n + concurrency;
    return options;
}

}  // namespace moat::cli
