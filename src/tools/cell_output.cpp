#include "tools/cell_output.hpp"

#include <algorithm>
#include <charconv>

namespace moat {

cell_output::cell_output(output_limits limits, cell_limits cell)
    : out_(limits), err_(limits), events_(cell) {}

void cell_output::keep(output_channel channel, std::string_view data) {
    if (data.empty()) return;
    (channel == output_channel::out ? out_ : err_).append(data);
    events_.add_stream(channel, data);
    if (sink_) sink_(channel, data);
}

void cell_output::feed(std::string_view data) {
    if (done_) {
        leftover_ += data;
        return;
    }
    if (broken_) {
        keep(output_channel::out, data);
        return;
    }
    while (!data.empty() && !done_ && !broken_) {
        if (tag_ == 'o' || tag_ == 'e' || tag_ == 'd') {
            // A data record: its bytes go straight to the capture or the events, never buffered.
            const std::size_t n = std::min(remaining_, data.size());
            if (tag_ == 'd') {
                events_.feed(data.substr(0, n));
            } else {
                keep(tag_ == 'o' ? output_channel::out : output_channel::err, data.substr(0, n));
            }
            data.remove_prefix(n);
            remaining_ -= n;
            if (remaining_ == 0) tag_ = 0;
            continue;
        }
        if (tag_ == 'r') {
            const std::size_t n = std::min(remaining_, data.size());
            pending_.append(data.substr(0, n));
            data.remove_prefix(n);
            remaining_ -= n;
            if (remaining_ == 0) {
                std::string_view line(pending_);
                if (line.ends_with('\n')) line.remove_suffix(1);
                status_line_ = std::string(line.substr(0, max_status_line));
                pending_.clear();
                tag_ = 0;
                done_ = true;
            }
            continue;
        }
        const auto newline = data.find('\n');
        const std::size_t take = newline == std::string_view::npos ? data.size() : newline + 1;
        pending_.append(data.substr(0, take));
        data.remove_prefix(take);
        if (pending_.back() != '\n') {
            if (pending_.size() > max_header) broken_ = true;
            continue;
        }
        consume();
    }
    if (broken_) {
        keep(output_channel::out, pending_);
        pending_.clear();
        keep(output_channel::out, data);
    } else if (done_) {
        leftover_ += data;
    }
}

void cell_output::consume() {
    // pending_ is one header line: a tag, a decimal length, a newline.
    const std::string_view header(pending_);
    const char tag = header.front();
    std::size_t length = 0;
    const auto digits = header.substr(1, header.size() - 2);
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), length);
    const bool valid = (tag == 'o' || tag == 'e' || tag == 'd' || tag == 'r') &&
                       header.size() <= max_header && !digits.empty() && parsed.ec == std::errc() &&
                       parsed.ptr == digits.data() + digits.size() && length <= max_record &&
                       (tag != 'r' || length <= max_status_line + 1);
    if (!valid) {
        broken_ = true;
        return;
    }
    pending_.clear();
    tag_ = tag;
    remaining_ = length;
    if (length == 0) {
        tag_ = 0;
        if (tag == 'r') done_ = true;
    }
}

captured_output cell_output::finish_out() {
    return out_.finish();
}

captured_output cell_output::finish_err() {
    return err_.finish();
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
