// Keeps the first `head` and the last `tail` bytes of a stream in fixed memory, counting the rest.
#pragma once

#include <moat/exec.hpp>

#include <string>
#include <string_view>

namespace moat {

class output_capture {
  public:
    explicit output_capture(output_limits limits);

    void append(std::string_view data);
    // The kept bytes; the capture is empty afterwards.
    captured_output finish();

  private:
    output_limits limits_;
    std::string head_;
    std::string ring_;            // tail ring buffer, ring_.size() <= limits_.tail_bytes
    std::size_t ring_start_ = 0;  // index of the oldest byte once the ring is full
    std::uint64_t total_ = 0;
};

}  // namespace moat
