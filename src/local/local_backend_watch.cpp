// File watches of the local backend's sandboxes (local_backend_impl.hpp is the contract between
// its files; watch.hpp the API). The sandbox's pid 1 makes an inotify instance and adds every
// watch in the sandbox's mount namespace (wire::watch_dir_message); this process reads the events
// straight from the instance on the executor, so no event passes through pid 1. A recursive watch
// asks pid 1 for a watch on each directory created below (and lists it, for what was made before
// its watch was in place).
#include "local/local_backend_impl.hpp"

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"
#include "local/inotify_records.hpp"
#include "wire/protocol.hpp"

#include <moat/log.hpp>

#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>

#include <sys/inotify.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <deque>
#include <set>

namespace moat {
namespace {

// pid 1 answers at once (an open and an inotify_add_watch).
constexpr auto agent_timeout = std::chrono::seconds(10);
constexpr std::size_t read_buffer_bytes = 64 * 1024;

// The agent's errno for a watch it could not add on `path`, as the file calls report a path.
error watch_error(const std::string& path, int watch_errno) {
    switch (watch_errno) {
        case ENOENT:
            return make_error(errc::file_not_found, path + ": no such file or directory");
        case ENOTDIR:
            return make_error(errc::invalid_path, path + ": not a directory");
        case EACCES:
        case EPERM:
            return make_error(errc::permission_denied, path + ": permission denied");
        case EMFILE:
        case ENFILE:
        case ENOSPC:
        case ENOMEM:
            return make_error(errc::limit_exceeded,
                              path + ": the sandbox's inotify limits or descriptors are used up (" +
                                  std::strerror(watch_errno) + ")");
        default:
            return make_error(errc::invalid_path, path + ": " + std::strerror(watch_errno));
    }
}

// `base` without trailing slashes ("/" stays).
std::string trimmed(std::string base) {
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    return base;
}

std::string joined(const std::string& dir, std::string_view name) {
    if (dir.empty()) return std::string(name);
    std::string out = dir;
    out += '/';
    out += name;
    return out;
}

}  // namespace

// One watch: the inotify instance, the directories it watches (by watch descriptor, their paths
// relative to the watched one), and the bounded queue the caller pulls.
struct watch_core {
    watch_core(const asio::any_io_executor& ex, std::string id, std::string watched,
               watch_options o, std::shared_ptr<agent_channel> a)
        : executor(ex),
          sandbox_id(std::move(id)),
          base(std::move(watched)),
          options(o),
          agent(std::move(a)),
          inotify(ex) {}

    bool stopped() const noexcept { return end.has_value(); }

    // Queues an event; past max_queued_events it is counted in an overflow marker instead.
    void push(watch_event event) {
        if (stopped()) return;
        if (events_queued >= options.max_queued_events) {
            if (!queue.empty() && std::holds_alternative<watch_overflow>(queue.back())) {
                ++std::get<watch_overflow>(queue.back()).lost;
            } else {
                queue.emplace_back(watch_overflow{1});
            }
        } else {
            queue.emplace_back(std::move(event));
            ++events_queued;
        }
        notify();
    }
    // The kernel's own queue overflowed: events lost, how many unknown.
    void push_kernel_overflow() {
        if (stopped()) return;
        if (queue.empty() || !std::holds_alternative<watch_overflow>(queue.back())) {
            queue.emplace_back(watch_overflow{0});
        }
        notify();
    }
    void finish(watch_end::reason why, std::string detail) {
        if (stopped()) return;
        end = watch_end{why, std::move(detail)};
        std::error_code ignored;
        inotify.close(ignored);
        paths.clear();
        notify();
    }
    void notify() {
        if (wake) wake->set();
    }

    asio::any_io_executor executor;
    std::string sandbox_id;
    std::string base;  // the watched directory, as the caller named it
    watch_options options;
    std::shared_ptr<agent_channel> agent;
    asio::posix::stream_descriptor inotify;
    std::map<std::int32_t, std::string> paths;  // watch descriptor -> path below base ("": base)
    std::int32_t root = -1;
    // Entries a new directory's listing reported as created: their own create record, already
    // in the kernel's queue when the listing ran, is not reported twice. Emptied whenever the
    // kernel's queue has been drained.
    std::set<std::string> listed;
    // Cookies of moves away from moat's temporary files (sandbox_files' is_temporary_name),
    // whose other half names the written file.
    std::set<std::uint32_t> temporary_moves;
    std::deque<watch_item> queue;
    std::size_t events_queued = 0;
    std::optional<watch_end> end;
    bool end_delivered = false;
    std::shared_ptr<async_event> wake;  // the waiting pull's
};

namespace {

asio::awaitable<result<watch_item>> next_item(std::shared_ptr<watch_core> c) {
    for (;;) {
        if (!c->queue.empty()) {
            watch_item item = std::move(c->queue.front());
            c->queue.pop_front();
            if (std::holds_alternative<watch_event>(item)) --c->events_queued;
            co_return item;
        }
        if (c->end) {
            if (c->end_delivered)
                co_return make_error(errc::invalid_argument, "the watch has ended");
            c->end_delivered = true;
            co_return watch_item{*c->end};
        }
        if (!c->wake || c->wake->is_set()) c->wake = std::make_shared<async_event>(c->executor);
        auto wake = c->wake;
        const auto waited = co_await wake->async_wait(deadline::never());
        if (waited == async_event::wait_outcome::cancelled) {
            co_return make_error(errc::cancelled, "watch: the pull was cancelled");
        }
    }
}

class local_dir_watch final : public dir_watch::impl {
  public:
    explicit local_dir_watch(std::shared_ptr<watch_core> core) : core_(std::move(core)) {}
    ~local_dir_watch() override {
        core_->finish(watch_end::reason::sandbox_ended, "the watch was dropped");
    }
    asio::awaitable<result<watch_item>> async_next() override { return guarded(next_item(core_)); }

  private:
    std::shared_ptr<watch_core> core_;
};

}  // namespace

asio::awaitable<result<dir_watch>> local_backend::async_watch_dir(std::string id, std::string path,
                                                                  watch_options options) {
    return guarded(watch_dir(std::move(id), std::move(path), options));
}

asio::awaitable<result<dir_watch>> local_backend::watch_dir(std::string id, std::string path,
                                                            watch_options options) {
    if (options.max_queued_events == 0) {
        co_return make_error(errc::invalid_argument, "watch: max_queued_events must be at least 1");
    }
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto agent = (*found)->agent;  // the sandbox may end while we wait
    // The file calls' resolution and the sandbox user's permissions decide what may be watched
    // (and give their errors); pid 1 then adds the watch on what the path names in the sandbox.
    auto root = file_root(id);
    if (!root) co_return std::move(root).error();
    if (auto listable = check_listable_dir(*root, path); !listable) {
        co_return std::move(listable).error();
    }
    const std::string base = trimmed(path);
    const std::string_view itself;  // named locals before the co_await (g++ 12)
    const auto limit = deadline::after(agent_timeout);
    auto answer = co_await agent->async_watch_dir(base, itself, watch_mask(), -1, limit);
    if (!answer) co_return std::move(answer).error();
    if (answer->watch_errno != 0) co_return watch_error(path, answer->watch_errno);
    auto core = std::make_shared<watch_core>(executor_, id, base, options, agent);
    std::error_code assigned;
    core->inotify.assign(answer->instance.get(), assigned);
    if (assigned) co_return make_error(errc::limit_exceeded, "watch: " + assigned.message());
    answer->instance.release();  // the descriptor owns it now
    core->root = answer->watch_descriptor;
    core->paths[core->root] = "";
    std::weak_ptr<watch_core> weak = core;
    agent->on_broken(core, [weak](const std::string& reason) {
        if (auto c = weak.lock()) c->finish(watch_end::reason::sandbox_ended, reason);
    });
    if (options.recursive) {
        std::string below;  // a named local (g++ 12): the watched directory itself
        co_await watch_tree(core, std::move(below), false);
    }
    if (core->stopped()) co_return make_error(errc::sandbox_unavailable, core->end->detail);
    tasks_.spawn(pump_watch(core));
    co_return dir_watch(std::make_unique<local_dir_watch>(core));
}

// Adds watches on `start` (unless it is the watched directory, watched already) and every
// directory below it, listing each once its watch is in place; with `report`, what a listing
// finds is reported as created (a burst that ran before the watch was there).
asio::awaitable<void> local_backend::watch_tree(std::shared_ptr<watch_core> c, std::string start,
                                                bool report) {
    const file_limits limits;
    std::deque<std::string> pending{std::move(start)};
    while (!pending.empty() && !c->stopped()) {
        const std::string dir = std::move(pending.front());
        pending.pop_front();
        if (c->base.size() + 1 + dir.size() > wire::max_watch_path_bytes) {
            detail::log(log_level::warning, "watch", "not watched (path too long): " + dir,
                        c->sandbox_id);
            continue;
        }
        if (!dir.empty()) {
            const int instance = c->inotify.native_handle();
            const auto limit = deadline::after(agent_timeout);
            auto added =
                co_await c->agent->async_watch_dir(c->base, dir, watch_mask(), instance, limit);
            if (!added || c->stopped()) co_return;  // the sandbox ended, or the watch did
            // Gone already, or swapped for a symlink: nothing to watch there.
            if (added->watch_errno != 0) continue;
            c->paths[added->watch_descriptor] = dir;
        }
        auto root = file_root(c->sandbox_id);
        if (!root) co_return;
        const std::string absolute = c->base == "/" ? "/" + dir : joined(c->base, dir);
        auto entries = list_dir(*root, absolute, limits);
        if (!entries) continue;
        for (const auto& entry : *entries) {
            std::string name = joined(dir, entry.name);
            const bool is_dir = entry.type == file_type::directory;
            if (report) {
                c->listed.insert(name);
                c->push(watch_event{name, watch_event_type::create, is_dir});
            }
            if (is_dir) pending.push_back(std::move(name));
        }
    }
}

// Reads the instance until the watch ends: every record the kernel hands out becomes events.
asio::awaitable<void> local_backend::pump_watch(std::shared_ptr<watch_core> c) {
    std::vector<std::byte> buffer(read_buffer_bytes);
    std::vector<inotify_record> records;
    while (!c->stopped()) {
        const auto token = as_tuple(asio::use_awaitable);
        auto [waited] =
            co_await c->inotify.async_wait(asio::posix::stream_descriptor::wait_read, token);
        if (waited || c->stopped()) break;
        for (;;) {
            const ssize_t n = ::read(c->inotify.native_handle(), buffer.data(), buffer.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                if (n < 0 && errno != EAGAIN) {
                    c->finish(watch_end::reason::sandbox_ended,
                              std::string("reading the watch failed: ") + std::strerror(errno));
                }
                c->listed.clear();  // every record the listings could have repeated was read
                break;
            }
            records.clear();
            const std::span<const std::byte> bytes(buffer.data(), static_cast<std::size_t>(n));
            if (!decode_inotify_records(bytes, records)) {
                detail::log(log_level::error, "watch", "a malformed inotify record", c->sandbox_id);
            }
            for (const auto& record : records) {
                co_await handle_watch_record(c, record);
                if (c->stopped()) co_return;
            }
        }
    }
}

asio::awaitable<void> local_backend::handle_watch_record(std::shared_ptr<watch_core> c,
                                                         inotify_record record) {
    const std::int32_t wd = record.watch_descriptor;
    if ((record.mask & IN_Q_OVERFLOW) != 0) {
        c->push_kernel_overflow();
        co_return;
    }
    const auto watched = c->paths.find(wd);
    if (watched == c->paths.end()) co_return;  // a watch removed meanwhile
    if ((record.mask & IN_IGNORED) != 0 || record.name.empty()) {
        // About a watched directory itself: its entry in its parent reports it, so only the
        // watched directory's own end matters.
        if (wd == c->root && (record.mask & (IN_IGNORED | IN_DELETE_SELF | IN_UNMOUNT)) != 0) {
            c->finish(watch_end::reason::directory_removed,
                      c->base + " was removed (or its filesystem unmounted)");
        } else if ((record.mask & IN_IGNORED) != 0) {
            c->paths.erase(watched);
        }
        co_return;
    }
    // moat's own atomic writes (a temporary file renamed over its target) show as envd's
    // in-place write would: the target created and written, never the temporary file.
    if (is_temporary_name(record.name)) {
        if ((record.mask & IN_MOVED_FROM) != 0 && record.cookie != 0) {
            if (c->temporary_moves.size() >= 64) c->temporary_moves.clear();
            c->temporary_moves.insert(record.cookie);
        }
        co_return;
    }
    std::string name = joined(watched->second, record.name);
    const bool is_dir = (record.mask & IN_ISDIR) != 0;
    if ((record.mask & IN_MOVED_TO) != 0 && c->temporary_moves.erase(record.cookie) != 0) {
        c->push(watch_event{name, watch_event_type::create, is_dir});
        c->push(watch_event{std::move(name), watch_event_type::write, is_dir});
        co_return;
    }
    if ((record.mask & IN_CREATE) != 0 && c->listed.erase(name) != 0) co_return;
    watch_event_type types[5];
    const std::size_t count = event_types(record.mask, types);
    for (std::size_t i = 0; i < count; ++i) c->push(watch_event{name, types[i], is_dir});
    if (!c->options.recursive || !is_dir) co_return;
    if ((record.mask & IN_MOVED_FROM) != 0) {
        // Moved away (perhaps out of the watch): its watches go; a move back in adds them anew.
        const std::string prefix = name + "/";
        for (auto it = c->paths.begin(); it != c->paths.end();) {
            if (it->second == name || it->second.starts_with(prefix)) {
                ::inotify_rm_watch(c->inotify.native_handle(), it->first);
                it = c->paths.erase(it);
            } else {
                ++it;
            }
        }
    }
    if ((record.mask & (IN_CREATE | IN_MOVED_TO)) != 0) {
        const bool created = (record.mask & IN_CREATE) != 0;
        co_await watch_tree(c, std::move(name), created);
    }
}

}  // namespace moat
