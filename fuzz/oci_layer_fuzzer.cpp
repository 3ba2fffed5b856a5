// libFuzzer target for an OCI layer's entries (src/templates/layer_entries.cpp): the bytes of a
// layer come from whoever made the image. The first byte picks the way in: a tar archive read by
// libarchive (plain or gzip), or entries given directly, one a line ("<type><path>[\t<hard
// link>]", type f d l p c), to reach the path rules without tar framing. Two layers are checked
// in turn on one checker, as a build checks an image's layers.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_oci_layer_fuzzer &&
//   build/fuzz/fuzz/moat_oci_layer_fuzzer -max_total_time=60 fuzz/corpus/oci_layer
#include "templates/layer_entries.hpp"

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace {

using moat::templates::layer_checker;
using moat::templates::layer_compression;

void check_lines(layer_checker& checker, std::string_view text) {
    while (!text.empty()) {
        const auto end = text.find('\n');
        std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
        if (line.empty()) continue;
        layer_checker::entry e;
        switch (line[0]) {
            case 'd':
                e.type = S_IFDIR;
                break;
            case 'l':
                e.type = S_IFLNK;
                break;
            case 'p':
                e.type = S_IFIFO;
                break;
            case 'c':
                e.type = S_IFCHR;
                break;
            default:
                e.type = S_IFREG;
                break;
        }
        line.remove_prefix(1);
        const auto tab = line.find('\t');
        e.path = line.substr(0, tab);
        if (tab != std::string_view::npos) e.hard_link = line.substr(tab + 1);
        e.size = static_cast<std::int64_t>(line.size());
        if (!checker.check_entry(e, "fuzz")) return;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::uint8_t mode = data[0];
    const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    layer_checker checker(1 << 20);
    if ((mode & 1) != 0) {
        // Two layers: the input split at its middle.
        check_lines(checker, rest.substr(0, rest.size() / 2));
        check_lines(checker, rest.substr(rest.size() / 2));
        return 0;
    }
    const auto compression = (mode & 2) != 0 ? layer_compression::gzip : layer_compression::none;
    if (checker.check_bytes(rest, compression, "fuzz"))
        (void)checker.check_bytes(rest, compression, "fuzz");
    if (checker.bytes() > (1u << 20)) __builtin_trap();  // past its cap it must have refused
    return 0;
}
