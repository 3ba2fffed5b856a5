#include <moat/with_timeout.hpp>

#include "core/exception_boundary.hpp"

#include <asio/error.hpp>
#include <asio/multiple_exceptions.hpp>

#include <system_error>

namespace moat::detail {

error timeout_error(const std::exception_ptr& failure, bool timer_fired) {
    if (timer_fired) return make_error(errc::deadline_exceeded, "the deadline passed");
    return error_from_exception(failure);
}

error deadline_error(const std::string& what_happened) {
    if (what_happened.empty()) return make_error(errc::deadline_exceeded, "the deadline passed");
    return make_error(errc::deadline_exceeded, "the deadline passed; " + what_happened);
}

}  // namespace moat::detail

namespace moat {

error error_from_exception(const std::exception_ptr& failure) {
    if (!failure) return make_error(errc::cancelled, "the caller cancelled the operation");
    try {
        std::rethrow_exception(failure);
    } catch (const std::system_error& e) {
        if (e.code() == asio::error::operation_aborted) {
            return make_error(errc::cancelled, "the caller cancelled the operation");
        }
        return make_error(errc::backend_failure, e.what());
    } catch (const asio::multiple_exceptions&) {
        return make_error(errc::cancelled, "the caller cancelled the operation");
    } catch (const std::exception& e) {
        return make_error(errc::backend_failure, e.what());
    } catch (...) {
        return make_error(errc::backend_failure, "an unknown exception");
    }
}

}  // namespace moat
