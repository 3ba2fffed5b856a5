#include "local/inotify_records.hpp"

#include <sys/inotify.h>
#include <algorithm>
#include <cstring>

namespace moat {

bool decode_inotify_records(std::span<const std::byte> bytes, std::vector<inotify_record>& out) {
    constexpr std::size_t fixed = sizeof(inotify_event);
    while (!bytes.empty()) {
        if (bytes.size() < fixed) return false;
        inotify_event event{};
        std::memcpy(&event, bytes.data(), fixed);
        if (event.len > bytes.size() - fixed) return false;
        const char* name = reinterpret_cast<const char*>(bytes.data() + fixed);
        const char* end = std::find(name, name + event.len, '\0');
        inotify_record record;
        record.watch_descriptor = event.wd;
        record.mask = event.mask;
        record.cookie = event.cookie;
        record.name = std::string_view(name, static_cast<std::size_t>(end - name));
        out.push_back(record);
        bytes = bytes.subspan(fixed + event.len);
    }
    return true;
}

std::uint32_t watch_mask() noexcept {
    return IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |
           IN_DELETE_SELF | IN_MOVE_SELF;
}

std::size_t event_types(std::uint32_t mask, watch_event_type (&out)[5]) noexcept {
    std::size_t n = 0;
    if ((mask & (IN_CREATE | IN_MOVED_TO)) != 0) out[n++] = watch_event_type::create;
    if ((mask & IN_MOVED_FROM) != 0) out[n++] = watch_event_type::rename;
    if ((mask & IN_ATTRIB) != 0) out[n++] = watch_event_type::chmod;
    if ((mask & IN_MODIFY) != 0) out[n++] = watch_event_type::write;
    if ((mask & IN_DELETE) != 0) out[n++] = watch_event_type::remove;
    return n;
}

}  // namespace moat
