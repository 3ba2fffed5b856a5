#include "handle/admission.hpp"

#include <algorithm>

namespace moat {

admission::admission(asio::any_io_executor executor, admission_limits limits)
    : executor_(std::move(executor)),
      limits_(limits),
      tokens_(static_cast<double>(limits.create_burst)),
      refilled_at_(std::chrono::steady_clock::now()) {}

void admission::refill() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - refilled_at_).count();
    refilled_at_ = now;
    tokens_ = std::min(static_cast<double>(std::max<std::size_t>(limits_.create_burst, 1)),
                       tokens_ + seconds * limits_.creates_per_second);
}

const char* admission::blocking_limit() {
    refill();
    if (stats_.creates_in_flight >= limits_.max_concurrent_creates) return "max_concurrent_creates";
    if (stats_.live_sandboxes + stats_.creates_in_flight >= limits_.max_live_sandboxes)
        return "max_live_sandboxes";
    if (tokens_ < 1.0) return "creates_per_second";
    return nullptr;
}

asio::awaitable<result<admission::ticket>> admission::async_admit(deadline limit) {
    if (limit.is_never()) limit = deadline::after(limits_.max_wait);
    for (;;) {
        const char* blocked = blocking_limit();
        if (blocked == nullptr) break;
        if (limit.has_expired()) {
            ++stats_.refused;
            co_return make_error(errc::limit_exceeded,
                                 std::string("admission: ") + blocked +
                                     " reached and no room came before the deadline");
        }
        // Woken when a create finishes or a sandbox ends; a token shortage wakes itself.
        auto waiter = std::make_shared<async_event>(executor_);
        waiters_.push_back(waiter);
        deadline wake = limit;
        if (tokens_ < 1.0 && limits_.creates_per_second > 0) {
            const auto next_token =
                std::chrono::duration<double>((1.0 - tokens_) / limits_.creates_per_second);
            wake = earliest(
                limit,
                deadline::after(
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(next_token)));
        }
        struct unregister {
            std::vector<std::shared_ptr<async_event>>& waiters;
            std::shared_ptr<async_event> waiter;
            ~unregister() { std::erase(waiters, waiter); }
        } registered{waiters_, waiter};
        // The caller's co_await checked for a pending cancellation, nothing here suspended since
        // (or the last wait consumed it), and async_wait never throws.
        const auto outcome = co_await waiter->async_wait(wake);
        if (outcome == async_event::wait_outcome::cancelled) {
            co_return make_error(errc::cancelled,
                                 "create was cancelled while waiting for admission");
        }
    }
    tokens_ -= 1.0;
    ++stats_.creates_in_flight;
    stats_.peak_creates_in_flight =
        std::max(stats_.peak_creates_in_flight, stats_.creates_in_flight);
    co_return ticket(this);
}

void admission::create_finished(bool created) {
    --stats_.creates_in_flight;
    if (created) ++stats_.live_sandboxes;
    wake_waiters();
}

void admission::sandbox_ended() {
    if (stats_.live_sandboxes > 0) --stats_.live_sandboxes;
    wake_waiters();
}

void admission::sandbox_attached() {
    ++stats_.live_sandboxes;
}

void admission::wake_waiters() {
    for (auto& w : waiters_) w->set();
}

}  // namespace moat
