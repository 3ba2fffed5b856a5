// pause_when_idle (session_manager.hpp): an idle session's sandbox paused instead of ended, and
// the budget of paused ones (count and memory), the one paused longest ago ended first.
#include "manager/session_manager_state.hpp"

#include <moat/log.hpp>

#include <algorithm>
#include <vector>

namespace moat {

asio::awaitable<void> session_manager::state::pause_if_idle(std::shared_ptr<state> self,
                                                            std::shared_ptr<session> s) {
    auto paused = co_await s->box->async_pause();
    s->idle_checking = false;
    if (!paused) {
        // Not pausable here (no cgroup2 mount, the sandbox ended): end it as an idle one.
        detail::log(log_level::info, "manager",
                    "idle pause failed, ending instead: " + paused.error().to_string(),
                    s->box->id());
        s->idle_checking = true;
        co_await end_if_idle(self, s);
        co_return;
    }
    if (s->holds > 0) {
        // Acquired while it was being paused: in use again.
        (void)co_await s->box->async_resume();
        co_return;
    }
    s->paused = true;
    s->paused_at = clock::now();
    co_await self->hold_paused_budget();
}

asio::awaitable<void> session_manager::state::hold_paused_budget() {
    auto self = shared_from_this();
    std::vector<std::shared_ptr<session>> paused;
    for (const auto& [key, s] : sessions) {
        if (s->paused && s->holds == 0) paused.push_back(s);
    }
    std::sort(paused.begin(), paused.end(),
              [](const auto& a, const auto& b) { return a->paused_at < b->paused_at; });
    std::vector<std::uint64_t> memory(paused.size(), 0);
    std::uint64_t total = 0;
    if (options.paused_memory_bytes > 0) {
        for (std::size_t i = 0; i < paused.size(); ++i) {
            auto reading = co_await paused[i]->box->async_usage();
            if (reading) memory[i] = reading->memory_used_bytes.value_or(0);
            total += memory[i];
        }
    }
    std::size_t count = paused.size();
    for (std::size_t i = 0; i < paused.size(); ++i) {
        const bool over_memory =
            options.paused_memory_bytes > 0 && total > options.paused_memory_bytes;
        if (count <= options.max_paused && !over_memory) break;
        // Still paused and unused: a session an acquire resumed meanwhile is not this one's.
        if (!paused[i]->paused || paused[i]->holds != 0) continue;
        --count;
        total -= memory[i];
        (void)co_await end_session(paused[i], end_reason::idle_timeout);
    }
}

}  // namespace moat
