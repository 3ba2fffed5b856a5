#include "tools/cell_output.hpp"

#include <algorithm>

namespace moat {

cell_output::cell_output(std::string marker, output_limits limits)
    : marker_(std::move(marker)), capture_(limits) {}

void cell_output::keep(std::string_view data) {
    if (data.empty()) return;
    capture_.append(data);
    if (sink_) sink_(data);
}

void cell_output::feed(std::string_view data) {
    if (done_) return;
    pending_ += data;
    const auto at = pending_.find(marker_);
    if (at != std::string::npos) {
        const auto end = pending_.find('\n', at);
        const std::size_t line_start = at + marker_.size();
        if (end == std::string::npos && pending_.size() - line_start < max_marker_line) {
            // Wait for the rest of the line; keep what precedes the marker out of the buffer.
            keep(std::string_view(pending_).substr(0, at));
            pending_.erase(0, at);
            return;
        }
        keep(std::string_view(pending_).substr(0, at));
        const std::size_t line_end = end == std::string::npos ? line_start + max_marker_line : end;
        marker_line_ =
            pending_.substr(line_start, std::min(line_end - line_start, max_marker_line));
        pending_.clear();
        done_ = true;
        return;
    }
    // Hold back only a suffix that could be the start of a marker split across reads, so the
    // rest reaches the sink (a streaming caller) as soon as it arrives.
    const std::string_view marker(marker_);
    std::size_t held = std::min(pending_.size(), marker.size() - 1);
    while (held > 0 && !std::string_view(pending_).ends_with(marker.substr(0, held))) --held;
    keep(std::string_view(pending_).substr(0, pending_.size() - held));
    pending_.erase(0, pending_.size() - held);
}

captured_output cell_output::finish() {
    if (!done_) keep(pending_);
    pending_.clear();
    return capture_.finish();
}

cell_status parse_marker_line(std::string_view line) {
    cell_status status;
    const auto first_space = line.find(' ');
    if (first_space == std::string_view::npos) return status;
    const auto second_space = line.find(' ', first_space + 1);
    const auto word = line.substr(first_space + 1, second_space == std::string_view::npos
                                                       ? std::string_view::npos
                                                       : second_space - first_space - 1);
    status.raised = word == "error";
    if (status.raised && second_space != std::string_view::npos) {
        const auto kind = line.substr(second_space + 1);
        if (kind != "-") status.exception_type = std::string(kind);
    }
    return status;
}

}  // namespace moat
