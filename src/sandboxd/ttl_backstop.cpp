#include "sandboxd/ttl_backstop.hpp"

#include <algorithm>
#include <ctime>

namespace moat::sandboxd {
namespace {

std::uint64_t read_ms(clockid_t clock) {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000 +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000;
}

// `boot_ms` moved by the signed difference `to - from`, clamped at 0.
std::uint64_t shifted(std::uint64_t boot_ms, std::uint64_t to, std::uint64_t from) {
    if (to >= from) return boot_ms + (to - from);
    return boot_ms - std::min(boot_ms, from - to);
}

}  // namespace

clock_reading read_clocks() {
    return {read_ms(CLOCK_BOOTTIME), read_ms(CLOCK_REALTIME)};
}

std::uint64_t backstop_at(clock_reading now, std::uint64_t ttl_ms) {
    return ttl_ms == 0 ? 0 : now.boot_ms + ttl_ms + backstop_grace_ms;
}

std::uint64_t recorded_backstop_at(std::uint64_t recorded_wall_ms, backstop_anchor anchor,
                                   clock_reading now) {
    if (recorded_wall_ms == anchor.recorded_wall_ms) return anchor.backstop_ms;
    const std::uint64_t through_anchor =
        shifted(anchor.backstop_ms, recorded_wall_ms, anchor.recorded_wall_ms);
    const std::uint64_t through_now =
        shifted(now.boot_ms, recorded_wall_ms, now.wall_ms) + backstop_grace_ms;
    return std::max(through_anchor, through_now);
}

}  // namespace moat::sandboxd
