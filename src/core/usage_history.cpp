#include <moat/usage.hpp>

#include <algorithm>

namespace moat {

void usage_history::add(const sandbox_usage& reading) {
    usage_sample sample{reading, std::nullopt};
    if (!samples_.empty()) {
        const auto& previous = samples_.back().usage;
        if (reading.at <= previous.at) return;
        if (reading.cpu_time_us && previous.cpu_time_us &&
            *reading.cpu_time_us >= *previous.cpu_time_us) {
            const double wall_us =
                std::chrono::duration<double, std::micro>(reading.at - previous.at).count();
            const double used_us =
                static_cast<double>(*reading.cpu_time_us - *previous.cpu_time_us);
            const double cpus = std::max<std::uint32_t>(reading.cpu_count, 1);
            sample.cpu_used_percent = std::clamp(100.0 * used_us / (wall_us * cpus), 0.0, 100.0);
        }
    }
    samples_.push_back(sample);
    while (samples_.size() > capacity_) samples_.pop_front();
}

std::vector<usage_sample> usage_history::between(std::chrono::system_clock::time_point from,
                                                 std::chrono::system_clock::time_point to) const {
    std::vector<usage_sample> out;
    for (const auto& s : samples_) {
        if (s.usage.at >= from && s.usage.at <= to) out.push_back(s);
    }
    return out;
}

std::optional<usage_sample> usage_history::latest() const {
    if (samples_.empty()) return std::nullopt;
    return samples_.back();
}

}  // namespace moat
