// sandbox::async_update_network (sandbox.hpp): the backend's update in the caller's lane, and
// the handle's info keeping the network the backend reports.
#include <moat/sandbox.hpp>

#include "core/exception_boundary.hpp"
#include "handle/sandbox_impl.hpp"

namespace moat {
namespace {

asio::awaitable<result<sandbox_info>> update_network(std::shared_ptr<sandbox::impl> state,
                                                     sandbox_network network, deadline limit,
                                                     lane in) {
    auto updated = co_await update_network_call(state, std::move(network), limit, in);
    if (updated) state->info.network = updated->network;
    co_return updated;
}

}  // namespace

asio::awaitable<result<sandbox_info>> sandbox::async_update_network(sandbox_network network,
                                                                    deadline limit, lane in) {
    return guarded(update_network(impl_, std::move(network), limit, in));
}

}  // namespace moat
