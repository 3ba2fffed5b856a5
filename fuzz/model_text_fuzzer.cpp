// libFuzzer target for the model-facing text functions: whatever a program prints, what a model
// reads back is valid UTF-8 without escapes or control characters, within the character bound,
// and a fixed point of cleaning.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_model_text_fuzzer &&
//   build/fuzz/fuzz/moat_model_text_fuzzer -max_total_time=60 fuzz/corpus/model_text
#include <moat/model_text.hpp>

#include "support/utf8_check.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

namespace {

// Room for the marker line: its text, a 26-character count and two newlines.
constexpr std::size_t marker_chars = 200;

void check(bool condition) {
    if (!condition) __builtin_trap();
}

// Valid UTF-8 without C1 controls (shaping removes them).
bool is_clean_utf8(std::string_view s) {
    return moat::test::is_valid_utf8(s) && !moat::test::has_c1_control(s);
}

void check_shaped(const moat::shaped_text& shaped, const moat::shaping_limits& limits) {
    const std::string_view text = shaped.text;
    check(is_clean_utf8(text));
    for (char c : text) {
        const auto b = static_cast<unsigned char>(c);
        check(b >= 0x20 ? b != 0x7F : (b == '\n' || b == '\t'));
    }
    const std::size_t bound =
        std::max(limits.max_chars, limits.head_chars + limits.tail_chars) + marker_chars;
    check(moat::test::count_chars(text) <= bound);
    if (shaped.is_truncated())
        check(text.find(" omitted; to see them, ") != std::string_view::npos);
    // Cleaning is idempotent: shaped text shapes to itself when nothing is cut.
    constexpr std::size_t all = std::numeric_limits<std::size_t>::max() / 4;
    const auto again = moat::shape_for_model(text, moat::shaping_limits{all, all, all});
    check(again.text == text && !again.is_truncated());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 5) return 0;
    const moat::shaping_limits limits{data[0] % 64U, data[1] % 64U, data[2] % 160U};
    const std::size_t split_seed = data[3];
    const std::uint64_t uncaptured = data[4] % 4U;
    const std::string_view text(reinterpret_cast<const char*>(data) + 5, size - 5);
    const std::size_t split = split_seed * text.size() / 255;

    check_shaped(moat::shape_for_model(text, limits), limits);
    check_shaped(moat::shape_for_model(text), moat::shaping_limits{});

    const auto head = text.substr(0, split);
    const auto tail = text.substr(split);
    const auto two_part = moat::shape_for_model(head, uncaptured, tail, limits);
    check_shaped(two_part, limits);
    check(uncaptured == 0 || two_part.omitted_chars >= uncaptured);

    moat::captured_output output;
    output.head = head;
    output.tail = tail;
    output.omitted_bytes = uncaptured;
    output.total_bytes = text.size() + uncaptured;
    check_shaped(moat::shape_for_model(output, limits), limits);

    const std::string type = moat::python_error_type(text);
    check(is_clean_utf8(type) && type.size() <= 200);
    check(type.find_first_of(" \n:") == std::string::npos);
    const std::string traceback = moat::python_traceback(text);
    check(is_clean_utf8(traceback));
    check(moat::test::count_chars(traceback) <= 3000 + marker_chars);
    check(type.empty() == traceback.empty());
    return 0;
}
