#include "core/output_capture.hpp"

#include <algorithm>

namespace moat {

output_capture::output_capture(output_limits limits) : limits_(limits) {}

void output_capture::append(std::string_view data) {
    total_ += data.size();
    const std::size_t to_head = std::min(data.size(), limits_.head_bytes - head_.size());
    head_.append(data.substr(0, to_head));
    data.remove_prefix(to_head);
    if (data.empty() || limits_.tail_bytes == 0) return;

    const std::size_t cap = limits_.tail_bytes;
    if (data.size() >= cap) {  // the new data alone fills the ring
        ring_.assign(data.substr(data.size() - cap));
        ring_start_ = 0;
        return;
    }
    if (ring_.size() < cap) {  // still filling
        const std::size_t room = cap - ring_.size();
        const std::size_t n = std::min(room, data.size());
        ring_.append(data.substr(0, n));
        data.remove_prefix(n);
        if (data.empty()) return;
    }
    // Ring is full: overwrite the oldest bytes, wrapping once at most.
    const std::size_t first = std::min(data.size(), cap - ring_start_);
    ring_.replace(ring_start_, first, data.substr(0, first));
    ring_.replace(0, data.size() - first, data.substr(first));
    ring_start_ = (ring_start_ + data.size()) % cap;
}

captured_output output_capture::finish() {
    captured_output out;
    out.total_bytes = total_;
    out.head = std::move(head_);
    std::string tail = ring_.substr(ring_start_) + ring_.substr(0, ring_start_);
    // Data that never left the head is not truncated: keep it contiguous in `head`.
    if (out.head.size() + tail.size() == total_) {
        out.head += tail;
    } else {
        out.tail = std::move(tail);
    }
    out.omitted_bytes = total_ - out.head.size() - out.tail.size();
    head_.clear();
    ring_.clear();
    ring_start_ = 0;
    total_ = 0;
    return out;
}

std::string captured_output::text() const {
    if (!is_truncated()) return head + tail;
    return head + "\n[... " + std::to_string(omitted_bytes) + " bytes omitted ...]\n" + tail;
}

}  // namespace moat
