// Splitting one output channel of the Python driver (stdout or stderr: bytes a sandboxed program
// writes, so untrusted) into the cell's own output and the driver's end marker. A pure state
// machine, unit-tested and fuzzed.
#pragma once

#include <moat/exec.hpp>

#include "core/output_capture.hpp"

#include <functional>
#include <string>
#include <string_view>

namespace moat {

class cell_output {
  public:
    // The longest marker line waited for ("<prefix>NNN error <exception type>\n"); a longer one
    // ends at this many bytes.
    static constexpr std::size_t max_marker_line = 512;

    // `marker` is the driver's end-marker prefix for this interpreter (python_cell_marker).
    cell_output(std::string marker, output_limits limits);

    // Also hands each piece of the cell's own output (never the marker) to `sink` as soon as it
    // is known not to be part of a marker, in order, whatever the capture keeps.
    void on_output(std::function<void(std::string_view)> sink) { sink_ = std::move(sink); }

    // Feeds bytes as they arrive, in any split. Bytes after the marker line are dropped (late
    // output of a background thread). Memory: the capture's limits plus the marker's length.
    void feed(std::string_view data);

    // The marker line has been seen.
    bool is_done() const noexcept { return done_; }
    // What followed the marker prefix up to its newline ("003 error KeyError"), once done.
    const std::string& marker_line() const noexcept { return marker_line_; }

    // The cell's output (everything before the marker; all of it if none came), as head + tail.
    captured_output finish();

  private:
    void keep(std::string_view data);

    std::function<void(std::string_view)> sink_;
    std::string marker_;
    output_capture capture_;
    std::string pending_;  // bytes that may be the start of the marker, or the marker line itself
    std::string marker_line_;
    bool done_ = false;
};

// The parsed marker line: the cell raised (status "error") and the exception's type ("" for "-").
struct cell_status {
    bool raised = false;
    std::string exception_type;
};
cell_status parse_marker_line(std::string_view line);

}  // namespace moat
