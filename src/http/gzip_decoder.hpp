// A streaming gzip decoder (RFC 1952, through zlib) for request bodies sent with
// Content-Encoding: gzip. Input is fed as it arrives, output is taken in pieces of a bounded size,
// and the total output is capped, so a small body that inflates to gigabytes (a "gzip bomb")
// costs one piece of memory and stops at the cap. Members may follow one another (a multi-member
// stream is one body, as Go's and gzip(1)'s readers take it); each member's CRC-32 and length
// are checked. No I/O: unit-tested in tests/gzip_decoder_test.cpp and fuzzed
// (fuzz/gzip_decoder_fuzzer.cpp).
#pragma once

#include <moat/result.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace moat::http {

class gzip_decoder {
  public:
    // `max_output`: the most bytes the whole stream may inflate to.
    explicit gzip_decoder(std::uint64_t max_output);
    ~gzip_decoder();
    gzip_decoder(const gzip_decoder&) = delete;
    gzip_decoder& operator=(const gzip_decoder&) = delete;

    // Inflates from the front of `input` (which may be empty), consuming what it used, and
    // returns at most `most` bytes (`most` > 0). Call it until it returns an empty piece: only
    // then is `input` used up and everything it holds delivered (zlib may hold output that needs
    // no more input), so more input is needed, or, if finished(), the stream is complete. Errors:
    // protocol_error ("the gzip body is corrupt: ..." / "not gzip"), too_large past max_output.
    // After an error every call fails again.
    result<std::string> decode(std::string_view& input, std::size_t most);

    // Whether the input so far ends exactly at the end of a member: a body that stops when this
    // is false was cut short.
    bool finished() const noexcept { return at_member_end_; }

  private:
    struct state;
    std::unique_ptr<state> z_;
    std::uint64_t max_output_;
    std::uint64_t total_out_ = 0;
    bool at_member_end_ = false;
    bool pending_output_ = false;  // the last inflate filled its room: it may hold more
    std::string failed_;           // set once an error was returned
};

}  // namespace moat::http
