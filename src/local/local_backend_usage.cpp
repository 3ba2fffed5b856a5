// What a local sandbox uses (local_backend_impl.hpp is the contract between the backend's files):
// its cgroups' counters and its writable filesystems, read from the host. Nothing is asked of the
// sandbox, so a busy or hostile one cannot slow or falsify the reading.
#include "local/local_backend_impl.hpp"

#include "core/exception_boundary.hpp"
#include "local/cgroup_stats.hpp"

#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <vector>

namespace moat {
namespace {

// The writable filesystems a local sandbox has (tmpfs each, sized by its limits).
constexpr const char* writable_mounts[] = {"workspace", "tmp", "home"};

}  // namespace

// Used and total bytes of the sandbox's writable filesystems, each counted once (by its fsid),
// through its root directory: a path in the sandbox resolves inside it, never on the host.
void read_disk_usage(int root, sandbox_usage& usage) {
    if (root < 0) return;
    std::vector<std::pair<int, int>> seen;
    std::uint64_t used = 0;
    std::uint64_t total = 0;
    bool any = false;
    for (const char* mount : writable_mounts) {
        const int dir = ::openat(root, mount, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir < 0) continue;
        struct statfs fs {};
        const int rc = ::fstatfs(dir, &fs);
        ::close(dir);
        if (rc != 0) continue;
        const std::pair<int, int> id{fs.f_fsid.__val[0], fs.f_fsid.__val[1]};
        bool counted = false;
        for (const auto& s : seen) counted = counted || s == id;
        if (counted) continue;
        seen.push_back(id);
        const auto block = static_cast<std::uint64_t>(fs.f_frsize ? fs.f_frsize : fs.f_bsize);
        total += static_cast<std::uint64_t>(fs.f_blocks) * block;
        used += static_cast<std::uint64_t>(fs.f_blocks - fs.f_bfree) * block;
        any = true;
    }
    if (!any) return;
    usage.disk_used_bytes = used;
    usage.disk_total_bytes = total;
}

asio::awaitable<result<sandbox_usage>> local_backend::async_usage(std::string id) {
    return guarded(usage(std::move(id)));
}

asio::awaitable<result<sandbox_usage>> local_backend::usage(std::string id) {
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    const auto& sandbox = **found;
    const auto& cgroups = sandbox.record.cgroups;
    sandbox_usage usage;
    usage.at = std::chrono::system_clock::now();
    usage.cpu_time_us = read_cpu_time_us(cgroups);
    const auto millicores = sandbox.record.limits.cpu_millicores.value_or(0);
    usage.cpu_count = millicores == 0 ? 1 : (millicores + 999) / 1000;
    const auto used = read_memory_used(cgroups);
    const auto cache = read_memory_cache(cgroups);
    if (used) usage.memory_used_bytes = cache && *cache <= *used ? *used - *cache : *used;
    usage.memory_cache_bytes = cache;
    usage.memory_limit_bytes = sandbox.record.limits.memory_bytes.value_or(0);
    read_disk_usage(sandbox.root.get(), usage);
    co_return usage;
}

}  // namespace moat
