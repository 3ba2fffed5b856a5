// moat::result<T>: the value of an operation or why it failed.
//
// Every public asynchronous operation returns asio::awaitable<moat::result<T>>. The member names
// mirror std::expected (has_value, operator bool, value, error, operator*, operator->), so code can
// move to std::expected later without churn. A failure is a moat::error: a std::error_code in
// moat's category (see errc.hpp) plus a one-line detail naming what was wrong. Details never
// contain secrets (API keys, tokens, Authorization headers).
//
//     moat::result<moat::exec_result> r = co_await backend.async_exec(id, request);
//     if (!r) log(r.error().code.message(), r.error().detail);
//     else    use(r->exit_code);
#pragma once

#include <moat/errc.hpp>

#include <cassert>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace moat {

struct error {
    std::error_code code;
    std::string detail;  // one line; names the path, layer, flag or field that was wrong

    // "deadline_exceeded: exec of python3 took longer than 2000 ms"
    std::string to_string() const;
};

inline error make_error(errc code, std::string detail) {
    return error{make_error_code(code), std::move(detail)};
}

// Thrown by result<T>::value() (and operator*, operator->) on a result that holds an error, like
// std::bad_expected_access: it carries that error, so what() reads "detail: code message".
class bad_result_access : public std::system_error {
  public:
    explicit bad_result_access(::moat::error e)
        : std::system_error(e.code, e.detail), error_(std::move(e)) {}
    const ::moat::error& error() const noexcept { return error_; }

  private:
    ::moat::error error_;
};

template <class T>
class [[nodiscard]] result {
    static_assert(!std::is_same_v<std::remove_cv_t<T>, ::moat::error>,
                  "result<error> is ambiguous");

  public:
    using value_type = T;

    result() requires std::is_default_constructible_v<T> : storage_(std::in_place_index<0>) {}
    result(T value) : storage_(std::in_place_index<0>, std::move(value)) {}      // NOLINT implicit
    result(::moat::error e) : storage_(std::in_place_index<1>, std::move(e)) {}  // NOLINT implicit

    bool has_value() const noexcept { return storage_.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }

    T& value() & { return checked_value(); }
    const T& value() const& { return const_cast<result*>(this)->checked_value(); }
    T&& value() && { return std::move(checked_value()); }

    const ::moat::error& error() const& {
        assert(!has_value());
        return std::get<1>(storage_);
    }
    ::moat::error&& error() && {
        assert(!has_value());
        return std::get<1>(std::move(storage_));
    }

    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

  private:
    T& checked_value() {
        if (!has_value()) throw bad_result_access(std::get<1>(storage_));
        return std::get<0>(storage_);
    }

    std::variant<T, ::moat::error> storage_;
};

template <>
class [[nodiscard]] result<void> {
  public:
    using value_type = void;

    result() = default;
    result(::moat::error e) : error_(std::move(e)), failed_(true) {}  // NOLINT implicit

    bool has_value() const noexcept { return !failed_; }
    explicit operator bool() const noexcept { return has_value(); }
    void value() const {
        if (failed_) throw bad_result_access(error_);
    }
    const ::moat::error& error() const& {
        assert(!has_value());
        return error_;
    }

  private:
    ::moat::error error_;
    bool failed_ = false;
};

}  // namespace moat
