// libFuzzer target for an OCI image layout's JSON (src/templates/oci_layout.cpp): index.json, a
// manifest and a config, written by whoever made the image. The same bytes go through each
// parser; what a parser accepts must satisfy what the build relies on.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_oci_layout_fuzzer &&
//   build/fuzz/fuzz/moat_oci_layout_fuzzer -max_total_time=60 fuzz/corpus/oci_layout
#include "templates/oci_layout.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace moat::templates;
    const std::string_view json(reinterpret_cast<const char*>(data), size);
    if (auto manifest = manifest_for_tag(json, "latest"))
        require(valid_blob_digest(manifest->digest));
    if (auto manifest = parse_manifest(json)) {
        require(valid_blob_digest(manifest->config.digest));
        require(!manifest->layers.empty() && manifest->layers.size() <= 1000);
        for (const auto& layer : manifest->layers) {
            require(valid_blob_digest(layer.digest));
            (void)compression_of(layer.media_type);
        }
        (void)check_config(json, manifest->layers.size());
    }
    (void)check_config(json, 1);
    (void)valid_tag(json);
    return 0;
}
