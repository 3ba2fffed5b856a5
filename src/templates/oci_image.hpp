// An OCI image layout turned into a root directory, for a template build (templates.hpp):
//
// 1. stage_oci_image: reads the layout's index.json, finds the manifest `tag` names, and copies
//    the manifest, the config and every layer into a private layout under the data directory,
//    hashing each blob as it is copied: a blob whose SHA-256 or size is not what its descriptor
//    says is refused before anything uses it, and what was checked is exactly what is unpacked
//    (the caller's directory may change meanwhile; the copy does not). Every layer's tar entries
//    are then checked (layer_entries.hpp): escapes, device nodes and foreign ids refuse the image,
//    naming the entry.
// 2. unpack_oci_image: runs Debian's umoci (`umoci raw unpack`) on the private layout, as a child
//    process in its own process group with a minimal environment, killed at the deadline. umoci
//    applies the layers in order, whiteouts included, and writes the ids the image holds (0-65535,
//    checked in step 1), which are what a layer stores. A failure's detail is one line of umoci's
//    stderr (the last it wrote, bounded).
// The root then goes through the same copy rules as a directory build (layer_tree.hpp).
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace moat::templates {

// Copies and checks image `tag` of the layout at `layout` into `staged` (created here). `max_bytes`
// caps the layers' file contents. invalid_argument for a broken or refused image (the detail names
// the document, blob or entry), file_not_found when the layout is missing, not_supported for what
// a template cannot take (zstd layers, a multi-platform index).
result<void> stage_oci_image(const std::string& layout, std::string_view tag,
                             const std::string& staged, std::uint64_t max_bytes);

// Unpacks the staged image (tag `tag`) into `rootfs` (created by umoci) with the working directory
// `work`, which holds both (so no path umoci parses holds a ':'): `staged` and `rootfs` are names
// inside it. layer_unavailable when umoci is not installed, deadline_exceeded when it ran past
// `deadline` (it was killed), backend_failure when it failed.
result<void> unpack_oci_image(const std::string& work, const std::string& staged,
                              std::string_view tag, const std::string& rootfs,
                              std::chrono::steady_clock::time_point deadline);

}  // namespace moat::templates
