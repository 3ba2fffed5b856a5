// sandbox::async_watch_dir (sandbox.hpp, watch.hpp): the backend's watch, opened in the caller's
// lane, then held by the caller alone (no place in a lane), counted against the handle's cap
// until it is dropped.
#include <moat/sandbox.hpp>

#include "core/exception_boundary.hpp"
#include "handle/sandbox_impl.hpp"

namespace moat {
namespace {

// Gives the handle's watch slot back when the watch goes.
class handle_watch final : public dir_watch::impl {
  public:
    handle_watch(std::shared_ptr<sandbox::impl> owner, dir_watch inner)
        : owner_(std::move(owner)), inner_(std::move(inner)) {}
    ~handle_watch() override {
        inner_ = dir_watch();
        --owner_->watches;
    }
    asio::awaitable<result<watch_item>> async_next() override { return inner_.async_next(); }

  private:
    std::shared_ptr<sandbox::impl> owner_;
    dir_watch inner_;
};

asio::awaitable<result<dir_watch>> open_watch(std::shared_ptr<sandbox::impl> state,
                                              std::string path, watch_options options,
                                              deadline limit, lane in) {
    if (auto refused = state->refusal()) co_return std::move(*refused);
    if (state->watches >= state->options.max_watches) {
        co_return make_error(errc::limit_exceeded,
                             "sandbox " + state->info.id + " has " +
                                 std::to_string(state->watches) +
                                 " directory watches open, its handle's limit "
                                 "(handle_options::max_watches): drop one first");
    }
    ++state->watches;  // the slot is this call's while it opens
    auto opened = co_await watch_dir_call(state, std::move(path), options, limit, in);
    if (!opened) {
        --state->watches;
        co_return std::move(opened).error();
    }
    co_return dir_watch(std::make_unique<handle_watch>(state, std::move(*opened)));
}

}  // namespace

asio::awaitable<result<dir_watch>> sandbox::async_watch_dir(std::string path, watch_options options,
                                                            deadline limit, lane in) {
    return guarded(open_watch(impl_, std::move(path), options, limit, in));
}

}  // namespace moat
