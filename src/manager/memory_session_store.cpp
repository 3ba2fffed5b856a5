// The memory store: session_store.hpp's contract in one process. A mutex (never held across a
// suspension) lets managers on several executors share it.
#include <moat/session_store.hpp>

#include "manager/store_entry.hpp"

#include <map>
#include <mutex>

namespace moat {
namespace {

class memory_session_store final : public session_store {
  public:
    asio::awaitable<result<std::optional<session_record>>> async_get(std::string key,
                                                                     deadline) override {
        std::lock_guard lock(mutex_);
        co_return store_detail::view(find(key), now());
    }

    asio::awaitable<result<session_claim>> async_claim(std::string key, std::string expected,
                                                       std::chrono::milliseconds lease,
                                                       deadline) override {
        std::lock_guard lock(mutex_);
        const auto at = now();
        auto answer = store_detail::claim(entries_[key], expected, lease, at,
                                          "m" + std::to_string(++tokens_));
        forget_if_empty(key);
        co_return answer;
    }

    asio::awaitable<result<bool>> async_renew(std::string key, std::string token,
                                              std::chrono::milliseconds lease, deadline) override {
        std::lock_guard lock(mutex_);
        auto* e = find(key);
        co_return e != nullptr&& store_detail::renew(*e, token, lease, now());
    }

    asio::awaitable<result<bool>> async_commit(std::string key, std::string token,
                                               std::string sandbox_id, std::uint64_t generation,
                                               std::chrono::milliseconds ttl, deadline) override {
        std::lock_guard lock(mutex_);
        auto* e = find(key);
        const bool committed =
            e != nullptr &&
            store_detail::commit(*e, token, std::move(sandbox_id), generation, ttl, now());
        sweep_some();
        co_return committed;
    }

    asio::awaitable<result<void>> async_release(std::string key, std::string token,
                                                deadline) override {
        std::lock_guard lock(mutex_);
        if (auto* e = find(key)) store_detail::release(*e, token);
        forget_if_empty(key);
        co_return result<void>{};
    }

    asio::awaitable<result<std::optional<session_touch>>> async_touch(std::string key,
                                                                      std::string sandbox_id,
                                                                      std::chrono::milliseconds ttl,
                                                                      bool take_notice,
                                                                      deadline) override {
        std::lock_guard lock(mutex_);
        auto* e = find(key);
        if (e == nullptr) co_return std::optional<session_touch>();
        co_return store_detail::touch(*e, sandbox_id, ttl, take_notice, now());
    }

    asio::awaitable<result<bool>> async_erase(
        std::string key, std::string sandbox_id,
        std::optional<std::chrono::milliseconds> unused_at_least,
        std::optional<std::chrono::milliseconds> remember_for, deadline) override {
        std::lock_guard lock(mutex_);
        auto* e = find(key);
        const bool erased = e != nullptr && store_detail::erase(*e, sandbox_id, unused_at_least,
                                                                remember_for, now());
        forget_if_empty(key);
        sweep_some();
        co_return erased;
    }

    bool is_shared() const noexcept override { return false; }

  private:
    static store_detail::time_point now() { return store_detail::clock::now(); }

    // The entry, with what has expired (its TTL, its claim's lease) dropped first.
    store_detail::entry* find(const std::string& key) {
        auto it = entries_.find(key);
        if (it == entries_.end()) return nullptr;
        store_detail::expire(it->second, now());
        if (store_detail::is_empty(it->second)) {
            entries_.erase(it);
            return nullptr;
        }
        return &it->second;
    }

    void forget_if_empty(const std::string& key) {
        auto it = entries_.find(key);
        if (it != entries_.end() && store_detail::is_empty(it->second)) entries_.erase(it);
    }

    // Drops up to sweep_step entries that have run out (TTLs, ended markers) and that nobody
    // asks about any more, from where the last sweep stopped: a key that is never used again
    // does not stay in memory for ever, and no call walks the whole map.
    void sweep_some() {
        static constexpr std::size_t sweep_step = 16;
        const auto at = now();
        auto it = entries_.upper_bound(sweep_after_);
        for (std::size_t i = 0; i < sweep_step; ++i) {
            if (it == entries_.end()) {
                sweep_after_.clear();
                it = entries_.begin();
                if (it == entries_.end()) return;
            }
            store_detail::expire(it->second, at);
            sweep_after_ = it->first;
            it = store_detail::is_empty(it->second) ? entries_.erase(it) : std::next(it);
        }
    }

    std::mutex mutex_;
    std::map<std::string, store_detail::entry> entries_;
    std::uint64_t tokens_ = 0;
    std::string sweep_after_;  // the last key a sweep looked at ("": start from the first)
};

}  // namespace

std::shared_ptr<session_store> make_memory_session_store() {
    return std::make_shared<memory_session_store>();
}

}  // namespace moat
