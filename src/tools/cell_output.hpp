// Decoding the Python driver's results channel (its stdout: framed records written by the
// driver's forwarder process, see python_driver.hpp) into a cell's stdout, stderr, structured
// events (display results, the error, the execution count: cell_events.hpp) and end record.
// The channel carries bytes a sandboxed program could also write, so it is untrusted: a pure
// state machine, unit-tested and fuzzed. Nothing in the cell's output is ever read as a record:
// the cell's bytes only arrive inside data records, so text that imitates a record is output.
#pragma once

#include <moat/exec.hpp>

#include "core/output_capture.hpp"
#include "tools/cell_events.hpp"

#include <functional>
#include <string>
#include <string_view>

namespace moat {

class cell_output {
  public:
    // The longest record header ("o65536\n"), the longest record and the longest end record
    // kept; a channel that breaks one of them is broken.
    static constexpr std::size_t max_header = 24;
    static constexpr std::size_t max_record = 1 << 20;
    static constexpr std::size_t max_status_line = 512;

    explicit cell_output(output_limits limits, cell_limits cell = {});

    // Also hands each piece of the cell's own output to `sink` as it is decoded, in order,
    // whatever the captures keep.
    void on_output(std::function<void(output_channel, std::string_view)> sink) {
        sink_ = std::move(sink);
    }
    // Hands each display result and error to `sink` as it is decoded, in order with the output
    // on_output receives.
    void on_event(cell_event_sink sink) { events_.on_event(std::move(sink)); }

    // Feeds the results channel as it arrives, in any split. Bytes after the end record are not
    // the cell's: leftover() hands them to the next cell. Memory: the captures' limits plus one
    // record.
    void feed(std::string_view data);
    // Bytes that arrive outside the framing (the driver's own stderr: Python's start-up and fatal
    // errors) are the cell's stderr.
    void feed_unframed(std::string_view data) { keep(output_channel::err, data); }

    // The end record has been seen.
    bool is_done() const noexcept { return done_; }
    // A record header was malformed: from there on, everything fed is kept as stdout.
    bool is_broken() const noexcept { return broken_; }
    // The end record's text ("003 error KeyError"), once done.
    const std::string& status_line() const noexcept { return status_line_; }
    // What followed the end record (late output of a background thread or child); empty after.
    std::string take_leftover() { return std::move(leftover_); }

    // The cell's output on each channel, as head + tail. Call each once.
    captured_output finish_out();
    captured_output finish_err();
    // The cell's record (moat/cell_result.hpp). Call once.
    cell_result finish_result() { return events_.finish(); }

  private:
    void keep(output_channel channel, std::string_view data);
    void consume();

    std::function<void(output_channel, std::string_view)> sink_;
    output_capture out_;
    output_capture err_;
    cell_result_builder events_;
    std::string pending_;   // an incomplete header, or an end record's partial text
    std::string leftover_;  // after the end record
    char tag_ = 0;          // the record being read, 0 between records
    std::size_t remaining_ = 0;
    std::string status_line_;
    bool done_ = false;
    bool broken_ = false;
};

// The parsed end record: the cell raised (status "error") and the exception's type ("" for "-").
struct cell_status {
    bool raised = false;
    std::string exception_type;
};
cell_status parse_marker_line(std::string_view line);

}  // namespace moat
