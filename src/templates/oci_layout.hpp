// The JSON of an OCI image layout (index.json, a manifest, a config): pure parsers of what the
// image's maker wrote, with simdjson, each document capped at max_oci_json_bytes. Only what a
// template build uses is read: the manifest a tag names, its config and its layers.
#pragma once

#include "templates/layer_entries.hpp"

#include <moat/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moat::templates {

inline constexpr std::size_t max_oci_json_bytes = 4 << 20;

struct oci_descriptor {
    std::string media_type;
    std::string digest;  // "sha256:<64 hex>"
    std::uint64_t size = 0;
};

struct oci_manifest {
    oci_descriptor config;
    std::vector<oci_descriptor> layers;
};

// sha256:<64 lowercase hex>: the only digest a build takes (it names a file under blobs/).
bool valid_blob_digest(std::string_view digest);

// [A-Za-z0-9_][A-Za-z0-9._-]* of at most 128 bytes (the OCI tag grammar).
bool valid_tag(std::string_view tag);

// The image manifest that index.json names `tag` (its org.opencontainers.image.ref.name).
// invalid_argument for a broken index or an unknown tag; not_supported for a nested index.
result<oci_descriptor> manifest_for_tag(std::string_view index_json, std::string_view tag);

// An image manifest: its config and layers (at most 1000), each a valid descriptor.
result<oci_manifest> parse_manifest(std::string_view json);

// An image config: a linux image whose rootfs.diff_ids has one entry per layer.
result<void> check_config(std::string_view json, std::size_t layers);

// The compression a layer media type names; not_supported for zstd (umoci 0.4.7 cannot unpack
// it) and for anything else.
result<layer_compression> compression_of(std::string_view media_type);

}  // namespace moat::templates
