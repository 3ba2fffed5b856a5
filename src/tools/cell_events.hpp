// Decoding the interpreter's structured channel (the driver's 'd' records, see python_driver.hpp)
// into a cell's display results, error and execution count, and keeping the cell's record
// (moat/cell_result.hpp) within its bounds. The channel carries what model-written code can
// forge, so it is untrusted: a pure state machine, unit-tested and fuzzed. A malformed item ends
// the structured part of the cell (what came before it is kept, nothing after it is read as
// structure); the cell's stdout and stderr are unaffected, as they travel in their own records.
//
// The items, concatenated across records:
//   R <main 0|1> <count>\n   a display result, followed by <count> representations:
//     +<media type> <n>\n<n bytes>   kept
//     ~<media type> <n>\n<n bytes>   kept, cut by the interpreter (text/plain only)
//     -<media type> <size>\n         dropped by the interpreter at its cap
//   E <a> <b> <c>\n<a bytes name><b bytes value><c bytes traceback>
//   C <n>\n                  the execution count
#pragma once

#include <moat/cell_result.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace moat {

using cell_event_sink = std::function<void(const cell_event&)>;

class cell_result_builder {
  public:
    static constexpr std::size_t max_header = 256;
    static constexpr std::size_t max_representations = 32;

    explicit cell_result_builder(cell_limits limits = {}) : limits_(limits) {}

    // Receives each display result and error as it is decoded (stream text is not repeated
    // here: the caller has it as it arrives).
    void on_event(cell_event_sink sink) { sink_ = std::move(sink); }

    // The cell's stdout or stderr, as it arrives: kept in order up to max_stream_bytes.
    void add_stream(output_channel channel, std::string_view data);
    // The structured channel, in any split.
    void feed(std::string_view data);

    bool is_broken() const noexcept { return state_ == state::broken; }
    // The record so far; the builder is empty afterwards.
    cell_result finish();

  private:
    enum class state { header, representation_header, body, broken };
    void on_header(std::string_view line);
    void on_representation_header(std::string_view line);
    void on_body_done();
    void start_body(std::string* target, std::uint64_t size, std::size_t keep);
    void end_result();
    void emit(cell_event event);
    void fail() { state_ = state::broken; }

    cell_limits limits_;
    cell_event_sink sink_;
    cell_result result_;
    state state_ = state::header;
    std::string line_;
    std::size_t kept_stream_ = 0;
    std::size_t kept_result_bytes_ = 0;
    std::size_t results_ = 0;
    // The display result or error being read.
    display_result pending_result_;
    std::size_t representations_left_ = 0;
    cell_error pending_error_;
    bool reading_error_ = false;
    std::uint64_t error_sizes_[3] = {0, 0, 0};
    int error_field_ = 0;
    // The body being read: `target_` (nullptr: skipped) keeps at most `keep_` of `remaining_`.
    std::string* target_ = nullptr;
    std::uint64_t remaining_ = 0;
    std::size_t keep_ = 0;
};

// "image/png", "application/vnd.foo+json": a media type as the channel may name one.
bool is_media_type(std::string_view text) noexcept;

}  // namespace moat
