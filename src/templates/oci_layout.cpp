#include "templates/oci_layout.hpp"

#include <simdjson.h>

#include <algorithm>

namespace moat::templates {
namespace {

constexpr std::string_view manifest_type = "application/vnd.oci.image.manifest.v1+json";
constexpr std::string_view index_type = "application/vnd.oci.image.index.v1+json";
constexpr std::size_t max_layers = 1000;

error bad(std::string_view what, std::string_view why) {
    return make_error(errc::invalid_argument,
                      "OCI image: " + std::string(what) + ": " + std::string(why));
}

// Parses `json` (copied into padded storage) into `parser`'s document, capped in size.
result<simdjson::dom::object> parse_object(simdjson::dom::parser& parser, std::string_view json,
                                           std::string_view what) {
    if (json.size() > max_oci_json_bytes) return bad(what, "larger than 4 MiB");
    simdjson::dom::object o;
    if (parser.parse(json.data(), json.size(), true).get_object().get(o) != simdjson::SUCCESS)
        return bad(what, "not a JSON object");
    return o;
}

result<oci_descriptor> descriptor(simdjson::dom::element e, std::string_view what) {
    oci_descriptor d;
    std::string_view text;
    if (e["mediaType"].get_string().get(text) != simdjson::SUCCESS)
        return bad(what, "a descriptor without a mediaType");
    d.media_type = text;
    if (e["digest"].get_string().get(text) != simdjson::SUCCESS || !valid_blob_digest(text))
        return bad(what, "a descriptor whose digest is not sha256:<64 hex>");
    d.digest = text;
    if (e["size"].get_uint64().get(d.size) != simdjson::SUCCESS)
        return bad(what, "a descriptor without a size");
    return d;
}

}  // namespace

bool valid_blob_digest(std::string_view digest) {
    constexpr std::string_view prefix = "sha256:";
    if (!digest.starts_with(prefix) || digest.size() != prefix.size() + 64) return false;
    return std::all_of(digest.begin() + prefix.size(), digest.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool valid_tag(std::string_view tag) {
    const auto word = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_';
    };
    if (tag.empty() || tag.size() > 128 || !word(tag[0])) return false;
    return std::all_of(tag.begin(), tag.end(),
                       [&](char c) { return word(c) || c == '.' || c == '-'; });
}

result<oci_descriptor> manifest_for_tag(std::string_view index_json, std::string_view tag) {
    simdjson::dom::parser parser;
    auto index = parse_object(parser, index_json, "index.json");
    if (!index) return index.error();
    simdjson::dom::array manifests;
    if ((*index)["manifests"].get_array().get(manifests) != simdjson::SUCCESS)
        return bad("index.json", "no \"manifests\" array");
    for (auto m : manifests) {
        std::string_view name;
        if (m["annotations"]["org.opencontainers.image.ref.name"].get_string().get(name) !=
                simdjson::SUCCESS ||
            name != tag)
            continue;
        auto found = descriptor(m, "index.json");
        if (!found) return found.error();
        if (found->media_type == index_type)
            return make_error(errc::not_supported,
                              "OCI image: tag '" + std::string(tag) +
                                  "' names an image index (a multi-platform image): copy one "
                                  "platform's image into the layout first");
        if (found->media_type != manifest_type)
            return bad("index.json", "tag '" + std::string(tag) + "' names a " +
                                         found->media_type.substr(0, 80) +
                                         ", not an image manifest");
        return found;
    }
    return bad("index.json", "no manifest is tagged '" + std::string(tag) + "'");
}

result<oci_manifest> parse_manifest(std::string_view json) {
    simdjson::dom::parser parser;
    auto o = parse_object(parser, json, "manifest");
    if (!o) return o.error();
    oci_manifest out;
    simdjson::dom::element config;
    if ((*o)["config"].get(config) != simdjson::SUCCESS) return bad("manifest", "no \"config\"");
    auto c = descriptor(config, "manifest config");
    if (!c) return c.error();
    out.config = std::move(*c);
    simdjson::dom::array layers;
    if ((*o)["layers"].get_array().get(layers) != simdjson::SUCCESS)
        return bad("manifest", "no \"layers\" array");
    for (auto layer : layers) {
        if (out.layers.size() == max_layers) return bad("manifest", "more than 1000 layers");
        auto d = descriptor(layer, "manifest layer");
        if (!d) return d.error();
        out.layers.push_back(std::move(*d));
    }
    if (out.layers.empty()) return bad("manifest", "no layers");
    return out;
}

result<void> check_config(std::string_view json, std::size_t layers) {
    simdjson::dom::parser parser;
    auto o = parse_object(parser, json, "config");
    if (!o) return o.error();
    std::string_view os;
    if ((*o)["os"].get_string().get(os) == simdjson::SUCCESS && os != "linux")
        return bad("config", "an image for " + std::string(os.substr(0, 40)) + ", not linux");
    simdjson::dom::array diff_ids;
    if ((*o)["rootfs"]["diff_ids"].get_array().get(diff_ids) != simdjson::SUCCESS)
        return bad("config", "no rootfs.diff_ids");
    if (diff_ids.size() != layers)
        return bad("config", "rootfs.diff_ids does not list one entry per layer");
    return {};
}

result<layer_compression> compression_of(std::string_view media_type) {
    if (media_type == "application/vnd.oci.image.layer.v1.tar") return layer_compression::none;
    if (media_type == "application/vnd.oci.image.layer.v1.tar+gzip") return layer_compression::gzip;
    if (media_type.ends_with("+zstd"))
        return make_error(errc::not_supported,
                          "OCI image: a zstd layer (umoci 0.4.7 cannot unpack it): recompress "
                          "it with gzip (skopeo copy --dest-compress-format gzip)");
    return make_error(errc::not_supported, "OCI image: a layer of media type '" +
                                               std::string(media_type.substr(0, 80)) +
                                               "' (a template takes tar and tar+gzip layers)");
}

}  // namespace moat::templates
