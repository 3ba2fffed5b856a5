#include <moat/errc.hpp>
#include <moat/result.hpp>

namespace moat {
namespace {

class errc_category final : public std::error_category {
  public:
    const char* name() const noexcept override { return "moat"; }
    std::string message(int value) const override { return to_string(static_cast<errc>(value)); }
    std::error_condition default_error_condition(int value) const noexcept override {
        switch (static_cast<errc>(value)) {
            case errc::cancelled:
                return condition::cancelled;
            case errc::deadline_exceeded:
                return condition::timeout;
            case errc::backend_failure:
            case errc::limit_exceeded:
            case errc::rate_limited:
            case errc::connection_refused:
                return condition::retryable;
            case errc::invalid_argument:
            case errc::invalid_path:
            case errc::file_not_found:
            case errc::is_directory:
            case errc::too_large:
            case errc::permission_denied:
            case errc::not_supported:
            case errc::sandbox_not_found:
            case errc::unauthorized:
            case errc::sandbox_paused:
                return condition::caller_error;
            case errc::protocol_error:
            case errc::layer_unavailable:
                return condition::backend_failure;
            case errc::sandbox_unavailable:
            case errc::shutting_down:
            case errc::store_unavailable:
                return condition::unavailable;
        }
        return {value, *this};
    }
};

class condition_category_impl final : public std::error_category {
  public:
    const char* name() const noexcept override { return "moat.condition"; }
    std::string message(int value) const override {
        switch (static_cast<condition>(value)) {
            case condition::cancelled:
                return "cancelled";
            case condition::timeout:
                return "timeout";
            case condition::retryable:
                return "retryable";
            case condition::caller_error:
                return "caller_error";
            case condition::backend_failure:
                return "backend_failure";
            case condition::unavailable:
                return "unavailable";
        }
        return "unknown";
    }
};

}  // namespace

const std::error_category& error_category() noexcept {
    static const errc_category instance;
    return instance;
}

const std::error_category& condition_category() noexcept {
    static const condition_category_impl instance;
    return instance;
}

std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

std::error_condition make_error_condition(condition c) noexcept {
    return {static_cast<int>(c), condition_category()};
}

const char* to_string(errc e) noexcept {
    switch (e) {
        case errc::cancelled:
            return "cancelled";
        case errc::deadline_exceeded:
            return "deadline_exceeded";
        case errc::invalid_argument:
            return "invalid_argument";
        case errc::sandbox_not_found:
            return "sandbox_not_found";
        case errc::sandbox_unavailable:
            return "sandbox_unavailable";
        case errc::limit_exceeded:
            return "limit_exceeded";
        case errc::layer_unavailable:
            return "layer_unavailable";
        case errc::backend_failure:
            return "backend_failure";
        case errc::protocol_error:
            return "protocol_error";
        case errc::not_supported:
            return "not_supported";
        case errc::shutting_down:
            return "shutting_down";
        case errc::file_not_found:
            return "file_not_found";
        case errc::invalid_path:
            return "invalid_path";
        case errc::is_directory:
            return "is_directory";
        case errc::permission_denied:
            return "permission_denied";
        case errc::too_large:
            return "too_large";
        case errc::unauthorized:
            return "unauthorized";
        case errc::rate_limited:
            return "rate_limited";
        case errc::store_unavailable:
            return "store_unavailable";
        case errc::connection_refused:
            return "connection_refused";
        case errc::sandbox_paused:
            return "sandbox_paused";
    }
    return "unknown";
}

std::string error::to_string() const {
    std::string s = code.category() == error_category()
                        ? moat::to_string(static_cast<errc>(code.value()))
                        : code.message();
    if (!detail.empty()) {
        s += ": ";
        s += detail;
    }
    return s;
}

}  // namespace moat
