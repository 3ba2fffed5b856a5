// The one place per public operation where exceptions become moat errors. Asio's cancellation
// exception (operation_aborted, or asio::multiple_exceptions from awaitable operators) becomes
// errc::cancelled; anything else errc::backend_failure with its message.
#pragma once

#include <moat/result.hpp>

#include <exception>

namespace moat {

error error_from_exception(const std::exception_ptr& failure);

}  // namespace moat
