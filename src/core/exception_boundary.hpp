// The one place per public operation where exceptions become moat errors. Asio's cancellation
// exception (operation_aborted, or asio::multiple_exceptions from awaitable operators) becomes
// errc::cancelled; anything else errc::backend_failure with its message.
#pragma once

#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <exception>

namespace moat {

error error_from_exception(const std::exception_ptr& failure);

// Awaits `body` and returns its result; an exception that escapes it becomes an error result
// (error_from_exception). Public operations are plain functions that return guarded(...) of
// their coroutine, so the boundary is the outermost frame: it also catches the throw Asio makes
// at the body's first co_await when the caller's cancellation is already pending. Whatever the
// body holds must be given back by RAII; this only stops the exception.
template <class T>
asio::awaitable<result<T>> guarded(asio::awaitable<result<T>> body) {
    std::exception_ptr failure;
    try {
        co_return co_await std::move(body);
    } catch (...) {
        failure = std::current_exception();
    }
    co_return error_from_exception(failure);
}

}  // namespace moat
