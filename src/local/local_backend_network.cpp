// Live network rules (backend::async_update_network, docs/network.md "Live updates"): the record
// is where a sandbox's rules live. An update checks the new network against the record's limit
// (egress/network_bounds.hpp) and writes it under the record lock; this process's proxy applies
// it at once, every other process serving the sandbox when its policy_source sees the record
// change.
#include "local/local_backend_impl.hpp"

#include <moat/log.hpp>

#include "core/exception_boundary.hpp"
#include "egress/egress_proxy.hpp"
#include "egress/network_bounds.hpp"
#include "egress/network_policy.hpp"
#include "wire/state_layout.hpp"

#include <sys/stat.h>

namespace moat {

namespace {

// What tells one version of a record file from another: every write renames a new file in.
struct file_identity {
    ino_t inode = 0;
    std::int64_t modified_ns = 0;
    off_t size = -1;
    bool operator==(const file_identity&) const = default;
};

file_identity identity_of(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return {};
    return {st.st_ino, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec, st.st_size};
}

}  // namespace

asio::awaitable<result<sandbox_info>> local_backend::async_update_network(std::string id,
                                                                          sandbox_network network) {
    return guarded(update_network(std::move(id), std::move(network)));
}

asio::awaitable<result<sandbox_info>> local_backend::update_network(std::string id,
                                                                    sandbox_network network) {
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto sandbox = *found;
    auto policy = egress::make_network_policy(network);
    if (!policy) co_return std::move(policy).error();
    if (!sandbox->egress && network.mode != network_mode::none) {
        co_return make_error(errc::not_supported,
                             "sandbox " + id +
                                 " was created with network none: it has no egress proxy endpoint, "
                                 "and none is added while it runs (create it with a network; an "
                                 "update may then narrow it and widen it again)");
    }
    const auto replace = [&](sandbox_record& r) -> result<void> {
        auto within = egress::check_network_update(network, r.network, r.network_limit);
        if (!within) {
            auto e = std::move(within).error();
            e.detail = "sandbox " + id + ": network update: " + e.detail;
            return e;
        }
        r.network = network;
        return {};
    };
    auto written = records_.update(id, replace);
    if (!written) co_return std::move(written).error();
    sandbox->record.network = network;
    sandbox->info.network = network;
    std::size_t closed = 0;
    if (egress_ && sandbox->egress) {
        auto applied = egress_->set_policy(id, std::move(*policy));
        if (applied) closed = *applied;
    }
    detail::log(log_level::info, "egress",
                "network updated to " + std::string(to_string(network.mode)) + " (" +
                    std::to_string(closed) + " connections closed)",
                id);
    co_return sandbox->info;
}

std::function<std::optional<egress::network_policy>()> local_backend::policy_source_for(
    const std::shared_ptr<local_sandbox>& sandbox) {
    const std::string path = wire::record_path(records_.state_dir(), sandbox->info.id);
    auto seen = std::make_shared<file_identity>(identity_of(path));
    std::weak_ptr<local_sandbox> weak = sandbox;
    sandbox_records records = records_;
    return [path, seen, weak, records]() -> std::optional<egress::network_policy> {
        auto live = weak.lock();
        const auto now = identity_of(path);
        if (!live || now == *seen) return std::nullopt;
        *seen = now;
        auto record = records.read(live->info.id);
        if (!record || record->network == live->record.network) return std::nullopt;
        auto policy = egress::make_network_policy(record->network);
        if (!policy) return std::nullopt;
        live->record.network = record->network;
        live->info.network = record->network;
        detail::log(
            log_level::info, "egress",
            "network changed by another process to " + std::string(to_string(record->network.mode)),
            live->info.id);
        return std::move(*policy);
    };
}

}  // namespace moat
