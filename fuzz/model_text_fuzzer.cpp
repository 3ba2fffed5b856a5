// libFuzzer target for the model-facing text functions: whatever a program prints, what a model
// reads back is valid UTF-8 without escapes or control characters, within the character bound,
// and a fixed point of cleaning.
//
//   cmake -S . -B build/fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang
//   -DMOAT_BUILD_FUZZERS=ON && cmake --build build/fuzz --target moat_model_text_fuzzer &&
//   build/fuzz/fuzz/moat_model_text_fuzzer -max_total_time=60
#include <moat/model_text.hpp>

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

bool is_valid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = 0;
        std::uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n = 2;
            cp = c & 0x1FU;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3;
            cp = c & 0x0FU;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4;
            cp = c & 0x07U;
        } else {
            return false;
        }
        if (i + n > s.size()) return false;
        for (std::size_t k = 1; k < n; ++k) {
            const auto d = static_cast<unsigned char>(s[i + k]);
            if ((d & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (d & 0x3FU);
        }
        constexpr std::uint32_t min_for_length[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_for_length[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        if (cp >= 0x80 && cp <= 0x9F) return false;  // C1 controls are removed
        i += n;
    }
    return true;
}

std::size_t count_chars(std::string_view s) {
    std::size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
}

void check_shaped(const moat::shaped_text& shaped, const moat::shaping_limits& limits) {
    const std::string_view text = shaped.text;
    check(is_valid_utf8(text));
    for (char c : text) {
        const auto b = static_cast<unsigned char>(c);
        check(b >= 0x20 ? b != 0x7F : (b == '\n' || b == '\t'));
    }
    const std::size_t bound =
        std::max(limits.max_chars, limits.head_chars + limits.tail_chars) + marker_chars;
    check(count_chars(text) <= bound);
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
    check(is_valid_utf8(type) && type.size() <= 200);
    check(type.find_first_of(" \n:") == std::string::npos);
    const std::string traceback = moat::python_traceback(text);
    check(is_valid_utf8(traceback));
    check(count_chars(traceback) <= 3000 + marker_chars);
    check(type.empty() == traceback.empty());
    return 0;
}
