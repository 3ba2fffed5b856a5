#include <moat/with_timeout.hpp>

#include <asio/error.hpp>

#include <system_error>

namespace moat::detail {

error timeout_error(const std::exception_ptr& failure, bool timer_fired) {
    if (timer_fired) return make_error(errc::deadline_exceeded, "the deadline passed");
    if (!failure) return make_error(errc::cancelled, "the caller cancelled the operation");
    try {
        std::rethrow_exception(failure);
    } catch (const std::system_error& e) {
        if (e.code() == asio::error::operation_aborted) {
            return make_error(errc::cancelled, "the caller cancelled the operation");
        }
        return make_error(errc::backend_failure, e.what());
    } catch (const std::exception& e) {
        return make_error(errc::backend_failure, e.what());
    }
}

}  // namespace moat::detail
