// Runs one blocking step (a read() or write() of a file, an open, a rename) on a thread pool and
// resumes the awaiting coroutine on its own executor with the step's result, so the executor
// serves other work meanwhile. The job is not cancellable once queued: callers keep each step
// bounded (one chunk) and look at their cancellation state between steps.
//
// While the job runs it holds outstanding work on the coroutine's executor (run() does not return
// under it). The pool must outlive every job: it is joined before its owner goes.
#pragma once

#include <moat/result.hpp>

#include "core/exception_boundary.hpp"

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <functional>
#include <optional>
#include <utility>

namespace moat {
namespace detail {

template <class T>
struct initiate_blocking_job {
    template <class Handler>
    void operator()(Handler handler, asio::thread_pool* pool,
                    std::function<result<T>()> work) const {
        auto executor = asio::get_associated_executor(handler);
        auto guard = asio::make_work_guard(executor);
        asio::post(*pool, [handler = std::move(handler), work = std::move(work),
                           guard = std::move(guard)]() mutable {
            std::optional<result<T>> outcome;
            try {
                outcome.emplace(work());
            } catch (...) {
                outcome.emplace(error_from_exception(std::current_exception()));
            }
            auto back = guard.get_executor();
            asio::post(back,
                       [handler = std::move(handler), outcome = std::move(outcome)]() mutable {
                           std::move(handler)(std::move(*outcome));
                       });
            guard.reset();
        });
    }
};

}  // namespace detail

// `work` runs on one of `pool`'s threads; an exception it throws becomes an error result.
template <class T>
asio::awaitable<result<T>> async_blocking_job(asio::thread_pool& pool,
                                              std::function<result<T>()> work) {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(result<T>)>(
        detail::initiate_blocking_job<T>{}, asio::use_awaitable, &pool, std::move(work));
}

}  // namespace moat
