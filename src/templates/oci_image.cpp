#include "templates/oci_image.hpp"

#include "core/json_writer.hpp"
#include "core/unique_fd.hpp"
#include "templates/layer_entries.hpp"
#include "templates/layer_tree.hpp"
#include "templates/oci_layout.hpp"
#include "templates/sha256.hpp"
#include "templates/tool_process.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace moat::templates {
namespace {

std::string sys_error(const std::string& what, int err) {
    return what + ": " + std::strerror(err);
}

std::string blob_path(const std::string& layout, std::string_view digest) {
    return layout + "/blobs/sha256/" + std::string(digest.substr(7));
}

result<void> write_all(int fd, std::string_view bytes, const std::string& path) {
    while (!bytes.empty()) {
        const ssize_t n = ::write(fd, bytes.data(), bytes.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error(errc::backend_failure, sys_error(path, errno));
        bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
}

result<void> write_file(const std::string& path, std::string_view text) {
    unique_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.is_open()) return make_error(errc::backend_failure, sys_error(path, errno));
    return write_all(fd.get(), text, path);
}

// Copies blob `d` of `layout` into `staged`, hashing it on the way: refused unless it is a
// regular file of d.size bytes whose SHA-256 is d.digest. With `keep`, its bytes are kept there
// too (a JSON document, capped at max_oci_json_bytes).
result<void> copy_verified_blob(const std::string& layout, const oci_descriptor& d,
                                const std::string& staged, std::string* keep) {
    const std::string from = blob_path(layout, d.digest);
    const std::string shown = "blob " + d.digest.substr(0, 19);
    if (keep != nullptr && d.size > max_oci_json_bytes)
        return make_error(errc::invalid_argument,
                          "OCI image: " + shown + ": a JSON document larger than 4 MiB");
    unique_fd in(::open(from.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!in.is_open())
        return make_error(errc::invalid_argument, "OCI image: " + sys_error(shown, errno));
    struct stat st {};
    if (::fstat(in.get(), &st) != 0 || !S_ISREG(st.st_mode))
        return make_error(errc::invalid_argument, "OCI image: " + shown + ": not a regular file");
    const std::string to = blob_path(staged, d.digest);
    unique_fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.is_open()) {
        if (errno == EEXIST) return {};  // the same blob twice: copied and checked already
        return make_error(errc::backend_failure, sys_error(to, errno));
    }
    sha256 hash;
    std::uint64_t total = 0;
    std::array<char, 64 * 1024> buffer;
    for (;;) {
        const ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error(errc::backend_failure, sys_error(from, errno));
        if (n == 0) break;
        const std::string_view bytes(buffer.data(), static_cast<std::size_t>(n));
        total += bytes.size();
        if (total > d.size) break;  // longer than its descriptor says: refused below
        hash.add(bytes);
        if (keep != nullptr) keep->append(bytes);
        if (auto written = write_all(out.get(), bytes, to); !written) return written;
    }
    if (total != d.size || "sha256:" + hash.hex() != d.digest)
        return make_error(errc::invalid_argument,
                          "OCI image: " + shown +
                              ": its content does not match its digest and size (a corrupt or "
                              "altered blob)");
    return {};
}

// index.json of the staged layout: the one manifest, under `tag`.
std::string staged_index(const oci_descriptor& manifest, std::string_view tag) {
    json_writer w;
    w.begin_object();
    w.key("schemaVersion").value(std::int64_t{2});
    w.key("manifests").begin_array();
    w.begin_object();
    w.key("mediaType").value(manifest.media_type);
    w.key("digest").value(manifest.digest);
    w.key("size").value(manifest.size);
    w.key("annotations").begin_object();
    w.key("org.opencontainers.image.ref.name").value(tag);
    w.end_object();
    w.end_object();
    w.end_array();
    w.end_object();
    return w.take();
}

result<void> make_layout_dirs(const std::string& staged) {
    for (const std::string& dir : {staged, staged + "/blobs", staged + "/blobs/sha256"}) {
        if (::mkdir(dir.c_str(), 0700) != 0)
            return make_error(errc::backend_failure, sys_error("mkdir " + dir, errno));
    }
    return {};
}

}  // namespace

result<void> stage_oci_image(const std::string& layout, std::string_view tag,
                             const std::string& staged, std::uint64_t max_bytes) {
    if (!valid_tag(tag))
        return make_error(errc::invalid_argument,
                          "OCI image: tag '" + std::string(tag.substr(0, 80)) +
                              "' is not [A-Za-z0-9_][A-Za-z0-9._-]* of at most 128 bytes");
    struct stat st {};
    if (::stat(layout.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return make_error(
            errc::file_not_found,
            "OCI image layout " + layout +
                ": not a directory (a docker save "
                "archive goes through skopeo copy docker-archive:FILE oci:DIR first)");
    auto index = read_small_file(layout + "/index.json", max_oci_json_bytes);
    if (!index) {
        if (index.error().code == errc::file_not_found)
            return make_error(errc::invalid_argument,
                              "OCI image layout " + layout + ": no index.json");
        return index.error();
    }
    auto manifest_descriptor = manifest_for_tag(*index, tag);
    if (!manifest_descriptor) return manifest_descriptor.error();
    if (auto made = make_layout_dirs(staged); !made) return made;

    std::string manifest_json;
    if (auto copied = copy_verified_blob(layout, *manifest_descriptor, staged, &manifest_json);
        !copied)
        return copied;
    auto manifest = parse_manifest(manifest_json);
    if (!manifest) return manifest.error();
    std::string config_json;
    if (auto copied = copy_verified_blob(layout, manifest->config, staged, &config_json); !copied)
        return copied;
    if (auto checked = check_config(config_json, manifest->layers.size()); !checked) return checked;

    layer_checker checker(max_bytes);
    std::uint64_t blob_bytes = 0;
    for (const auto& layer : manifest->layers) {
        auto compression = compression_of(layer.media_type);
        if (!compression) return compression.error();
        blob_bytes += layer.size;
        if (blob_bytes > max_bytes)
            return make_error(errc::too_large, "OCI image: its layers are past the limit of " +
                                                   std::to_string(max_bytes) + " bytes");
        if (auto copied = copy_verified_blob(layout, layer, staged, nullptr); !copied)
            return copied;
        auto checked =
            checker.check_file(blob_path(staged, layer.digest), *compression, layer.digest);
        if (!checked) return checked;
    }
    if (auto written = write_file(staged + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
        !written)
        return written;
    return write_file(staged + "/index.json", staged_index(*manifest_descriptor, tag));
}

result<void> unpack_oci_image(const std::string& work, const std::string& staged,
                              std::string_view tag, const std::string& rootfs,
                              std::chrono::steady_clock::time_point deadline) {
    // As root umoci writes the image's own owners (not --rootless, which would make every file
    // ours): they are ids as the sandbox sees them, which is what a layer stores.
    const std::vector<std::string> argv = {
        "umoci", "--log", "error", "raw", "unpack", "--image", staged + ":" + std::string(tag),
        rootfs};
    return run_tool(argv, work, deadline);
}

}  // namespace moat::templates
