// The records an inotify instance hands out (struct inotify_event, followed by a name padded with
// NULs), decoded from a read's bytes, and what each means for a watch (watch.hpp): pure functions,
// fuzzed (fuzz/inotify_records_fuzzer.cpp). The kernel writes the records, but a name comes from
// the sandbox: it is read only within its record, up to its first NUL.
#pragma once

#include <moat/watch.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace moat {

struct inotify_record {
    std::int32_t watch_descriptor = -1;
    std::uint32_t mask = 0;
    std::uint32_t cookie = 0;
    std::string_view name;  // a view into the bytes decoded; "" for the watched directory itself
};

// The records in `bytes` (what one read returned), in order. False when the bytes end inside a
// record, or a name's length runs past them; the records before that point are in `out`.
bool decode_inotify_records(std::span<const std::byte> bytes, std::vector<inotify_record>& out);

// What a watch asks the kernel for on each directory.
std::uint32_t watch_mask() noexcept;

// The event types a named record reports, in envd's order (create, rename, chmod, write, remove;
// one inotify record may carry several): IN_CREATE and IN_MOVED_TO are create, IN_MOVED_FROM
// rename, IN_ATTRIB chmod, IN_MODIFY write, IN_DELETE remove. At most 5.
std::size_t event_types(std::uint32_t mask, watch_event_type (&out)[5]) noexcept;

}  // namespace moat
