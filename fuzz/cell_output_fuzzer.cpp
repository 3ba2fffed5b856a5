// libFuzzer target for cell_output: arbitrary bytes on the driver's results channel (a sandboxed
// program can write there), fed in chunks whose sizes come from the input.
// Checks: every byte fed is accounted for (as output, a header, an end record or leftover),
// memory stays bounded, and an end record never exceeds its limit.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_cell_output_fuzzer &&
//   build/fuzz/fuzz/moat_cell_output_fuzzer -max_total_time=60 fuzz/corpus/cell_output
#include "tools/cell_output.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    const std::size_t chunk = 1 + data[0] % 17;
    const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    const moat::output_limits limits{4096, 4096};
    moat::cell_limits cell;
    cell.max_representation_bytes = 512;
    cell.max_result_bytes = 2048;
    cell.max_results = 4;
    cell.max_stream_bytes = 1024;
    cell.max_error_bytes = 256;
    moat::cell_output reader(limits, cell);
    std::uint64_t streamed = 0;
    reader.on_output([&](moat::output_channel, std::string_view d) { streamed += d.size(); });
    for (std::size_t at = 0; at < input.size(); at += chunk) reader.feed(input.substr(at, chunk));
    const auto status = moat::parse_marker_line(reader.status_line());
    (void)status;
    const auto leftover = reader.take_leftover();
    const auto out = reader.finish_out();
    const auto err = reader.finish_err();
    if (out.total_bytes + err.total_bytes != streamed) std::abort();
    if (streamed + leftover.size() > input.size()) std::abort();
    if (reader.is_broken() && reader.is_done()) std::abort();
    if (!reader.is_done() && !leftover.empty()) std::abort();
    if (reader.status_line().size() > moat::cell_output::max_status_line) std::abort();
    if (out.head.size() > limits.head_bytes || out.tail.size() > limits.tail_bytes) std::abort();
    // The structured record stays within its bounds, whatever the channel claims.
    const auto record = reader.finish_result();
    std::size_t kept = 0;
    std::size_t stream = 0;
    for (const auto& event : record.events) {
        if (const auto* text = std::get_if<moat::stream_text>(&event)) stream += text->text.size();
        if (const auto* error = std::get_if<moat::cell_error>(&event)) {
            if (error->name.size() > cell.max_error_bytes ||
                error->traceback.size() > cell.max_error_bytes) {
                std::abort();
            }
        }
    }
    for (const auto* r : record.results()) {
        for (const auto& rep : r->representations) {
            if (rep.data.size() > cell.max_representation_bytes) std::abort();
            kept += rep.data.size();
        }
    }
    if (kept > cell.max_result_bytes || stream > cell.max_stream_bytes) std::abort();
    if (record.results().size() > cell.max_results) std::abort();
    return 0;
}
