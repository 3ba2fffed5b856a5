// Watching a directory of a sandbox for changes (backend::async_watch_dir,
// sandbox::async_watch_dir).
//
// A watch reports what happens to the entries of one directory, or, recursive, of every directory
// below it (those created later included): an entry created, written, removed, renamed or having
// its attributes changed, as E2B's envd reports them (its EVENT_TYPE_* values, from inotify). The
// events come in the order the kernel saw them; the kernel merges an event identical to the one
// before it that nobody has read yet (two writes of one file in a row may be one write event).
//
// Memory is bounded: events wait in a queue of at most watch_options::max_queued_events. When the
// caller does not pull and the queue is full, further events are counted, not kept: the next pull
// after the queue drains returns one watch_overflow with that count, and the watch goes on. The
// kernel's own queue (fs.inotify.max_queued_events) overflowing is reported the same way, with
// a count of 0 (unknown). After an overflow a caller that needs the exact state lists the
// directory again.
//
// A watch ends (its last item is a watch_end; pulling again is invalid_argument) when the watched
// directory itself is removed, or when the sandbox ends (destroyed, quarantined, its TTL). Dropping
// the dir_watch stops it at once: its kernel resources (the inotify instance) are released then,
// and nothing of it stays in the sandbox.
#pragma once

#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>

namespace moat {

struct watch_options {
    // Watch the directories below the watched one too, and each directory created below it
    // later (a burst such as `mkdir -p a/b/c && touch a/b/c/f` is reported whole: a directory's
    // entries made before its watch was in place are reported as created).
    bool recursive = false;
    // The most events kept for a caller that does not pull (at least 1); past it, a
    // watch_overflow.
    std::size_t max_queued_events = 1024;
};

// E2B's envd event types (its EventType, the same order).
enum class watch_event_type {
    create,  // created, or moved into the directory
    write,   // its content was written (each write may be an event)
    remove,  // removed
    rename,  // moved away from its name (the new name, if inside the watch, is a create)
    chmod,   // its attributes changed (mode, owner, times)
};

// "create", "write", "remove", "rename", "chmod".
const char* to_string(watch_event_type type) noexcept;

struct watch_event {
    // The entry's path relative to the watched directory ("a/b/file" in a recursive watch).
    std::string name;
    watch_event_type type = watch_event_type::create;
    bool is_dir = false;
};

// Events were lost: the queue was full (`lost` of them), or the kernel's queue overflowed
// (`lost` is 0: unknown).
struct watch_overflow {
    std::uint64_t lost = 0;
};

// The last item of a watch: why it ended.
struct watch_end {
    enum class reason { directory_removed, sandbox_ended };
    reason why = reason::sandbox_ended;
    std::string detail;
};

using watch_item = std::variant<watch_event, watch_overflow, watch_end>;

class dir_watch {
  public:
    struct impl {
        virtual ~impl() = default;
        virtual asio::awaitable<result<watch_item>> async_next() = 0;
    };

    dir_watch() = default;
    explicit dir_watch(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

    // The next event, overflow marker or end, waiting until there is one.
    // Per-Operation Cancellation: terminal for the call only: it completes with errc::cancelled
    // and the watch goes on (nothing is lost; the next pull returns what came meanwhile).
    asio::awaitable<result<watch_item>> async_next() { return impl_->async_next(); }

    explicit operator bool() const noexcept { return impl_ != nullptr; }

  private:
    std::unique_ptr<impl> impl_;
};

}  // namespace moat
