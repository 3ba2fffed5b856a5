// libFuzzer target for cell_output: arbitrary bytes (a sandboxed program's output, which may
// imitate or split the driver's end marker), fed in chunks whose sizes come from the input.
// Checks: the output before a marker is exactly what was fed before it, memory stays bounded,
// and a parsed marker line never exceeds its limit.
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
    const std::string marker = "\x1emoat-cell-ab ";
    const std::size_t chunk = 1 + data[0] % 17;
    const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    const moat::output_limits limits{4096, 4096};
    moat::cell_output reader(marker, limits);
    for (std::size_t at = 0; at < input.size(); at += chunk) reader.feed(input.substr(at, chunk));
    const auto status = moat::parse_marker_line(reader.marker_line());
    (void)status;
    const auto out = reader.finish();
    const auto found = input.find(marker);
    if (reader.is_done()) {
        if (found == std::string_view::npos) std::abort();
        if (out.total_bytes != found) std::abort();
        if (reader.marker_line().size() > moat::cell_output::max_marker_line) std::abort();
    } else if (out.total_bytes != input.size()) {
        std::abort();  // without a marker line, everything is the cell's output
    }
    if (out.head.size() > limits.head_bytes || out.tail.size() > limits.tail_bytes) std::abort();
    return 0;
}
