#include "sandboxd/pid_lines.hpp"

#include <charconv>

namespace moat::sandboxd {

void pid_lines::feed(std::string_view chunk, std::vector<int>& pids) {
    for (const char c : chunk) {
        if (c == '\n') {
            end_line(pids);
        } else if (c < '0' || c > '9' || length_ == max_digits) {
            bad_ = true;
        } else if (!bad_) {
            digits_[length_++] = c;
        }
    }
}

void pid_lines::end_line(std::vector<int>& pids) {
    int pid = 0;
    const auto [end, ec] = std::from_chars(digits_, digits_ + length_, pid);
    const bool whole = !bad_ && length_ != 0 && ec == std::errc{} && end == digits_ + length_;
    if (whole && pid > 0) {
        pids.push_back(pid);
    } else {
        ++skipped_;
    }
    length_ = 0;
    bad_ = false;
}

void pid_lines::finish() {
    if (length_ != 0 || bad_) ++skipped_;
    length_ = 0;
    bad_ = false;
}

}  // namespace moat::sandboxd
