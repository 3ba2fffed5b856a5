// sandbox::async_pause and async_resume, and what other operations do on a paused sandbox
// (sandbox.hpp is the contract: handle_options::on_paused).
#include "handle/sandbox_run.hpp"

#include <cstring>

namespace moat {
namespace {

// The operations that leave a paused sandbox as it is.
bool works_while_paused(const char* what) {
    for (const char* name : {"pause", "resume", "usage", "extend_ttl"}) {
        if (std::strcmp(what, name) == 0) return true;
    }
    return false;
}

}  // namespace

asio::awaitable<result<void>> sandbox::impl::unpause_for(std::shared_ptr<impl> self,
                                                         const char* what, deadline limit) {
    if (works_while_paused(what) || !self->sandboxes.is_paused(self->info.id)) {
        co_return result<void>{};
    }
    if (self->options.on_paused == paused_policy::fail) {
        co_return make_error(errc::sandbox_paused,
                             std::string(what) + ": sandbox " + self->info.id +
                                 " is paused; resume it first (sandbox::async_resume)");
    }
    std::function<asio::awaitable<result<sandbox_info>>()> start = [self]() {
        return self->sandboxes.async_resume(self->info.id);
    };
    auto resumed = co_await run_in_turn<sandbox_info>(self, "resume", limit, start);
    if (!resumed) co_return std::move(resumed).error();
    self->info.state = resumed->state;
    self->info.expires_at = resumed->expires_at;
    co_return result<void>{};
}

asio::awaitable<result<sandbox_info>> sandbox::async_pause(deadline limit) {
    return run_call(impl_, "pause", limit, lane::ordered, &backend::async_pause);
}

asio::awaitable<result<sandbox_info>> sandbox::async_resume(deadline limit) {
    return run_call(impl_, "resume", limit, lane::ordered, &backend::async_resume);
}

}  // namespace moat
