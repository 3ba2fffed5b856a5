#include "core/go_signals.hpp"

#include <array>
#include <charconv>

namespace moat::detail {
namespace {

// Go's syscall signal table for Linux, indexed by signal number.
constexpr std::array<std::string_view, 32> go_signal_names = {
    "",
    "hangup",
    "interrupt",
    "quit",
    "illegal instruction",
    "trace/breakpoint trap",
    "aborted",
    "bus error",
    "floating point exception",
    "killed",
    "user defined signal 1",
    "segmentation fault",
    "user defined signal 2",
    "broken pipe",
    "alarm clock",
    "terminated",
    "stack fault",
    "child exited",
    "continued",
    "stopped (signal)",
    "stopped",
    "stopped (tty input)",
    "stopped (tty output)",
    "urgent I/O condition",
    "CPU time limit exceeded",
    "file size limit exceeded",
    "virtual timer expired",
    "profiling timer expired",
    "window changed",
    "I/O possible",
    "power failure",
    "bad system call",
};

}  // namespace

std::string go_signal_name(int signal) {
    if (signal > 0 && signal < static_cast<int>(go_signal_names.size())) {
        return std::string(go_signal_names[static_cast<std::size_t>(signal)]);
    }
    return "signal " + std::to_string(signal);
}

int signal_from_go_name(std::string_view name) {
    for (std::size_t i = 1; i < go_signal_names.size(); ++i) {
        if (go_signal_names[i] == name) return static_cast<int>(i);
    }
    if (name.starts_with("signal ")) {
        int n = 0;
        const auto digits = name.substr(7);
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
        if (ec == std::errc{} && end == digits.data() + digits.size() && n > 0 && n < 65) return n;
    }
    return 0;
}

}  // namespace moat::detail
