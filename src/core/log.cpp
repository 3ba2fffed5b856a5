#include <moat/log.hpp>

#include <atomic>
#include <memory>
#include <mutex>

namespace moat {
namespace {

std::mutex sink_mutex;
std::shared_ptr<const log_sink> current_sink;  // guarded by sink_mutex
std::atomic<bool> sink_installed{false};

}  // namespace

void set_log_sink(log_sink sink) {
    std::shared_ptr<const log_sink> next;
    if (sink) next = std::make_shared<const log_sink>(std::move(sink));
    const std::lock_guard lock(sink_mutex);
    current_sink = std::move(next);
    sink_installed.store(current_sink != nullptr, std::memory_order_release);
}

const char* to_string(log_level level) noexcept {
    switch (level) {
        case log_level::debug:
            return "debug";
        case log_level::info:
            return "info";
        case log_level::warning:
            return "warning";
        case log_level::error:
            return "error";
    }
    return "unknown";
}

namespace detail {

bool log_enabled() noexcept {
    return sink_installed.load(std::memory_order_acquire);
}

void log(log_level level, std::string_view component, std::string_view message,
         std::string_view sandbox_id) {
    if (!log_enabled()) return;
    std::shared_ptr<const log_sink> sink;
    {
        const std::lock_guard lock(sink_mutex);
        sink = current_sink;
    }
    if (sink) (*sink)(log_record{level, component, message, sandbox_id});
}

}  // namespace detail
}  // namespace moat
