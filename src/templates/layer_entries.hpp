// The entries of an OCI image's layers (tar archives, plain or gzip), checked before anything is
// unpacked: these bytes come from whoever made the image. libarchive reads the archive; the rules
// are ours. An image is refused, naming the entry, when an entry
// - has an absolute path or a `..` component (it would land outside the root),
// - would be written through a symbolic link that an earlier entry (in this layer or a lower one)
//   made: `evil -> /etc` then `evil/passwd`, or `up -> ../..` then `up/x`. umoci would write such
//   an entry safely inside the root instead (securejoin); a template build refuses it outright,
//   which also refuses the rarer benign case of a path through an in-root link (image builders
//   write real paths, so layers made from a file system diff never have one),
// - is a hard link whose target breaks either rule,
// - is a device node or a socket, or is owned by an id of 65536 or more (a layer holds neither),
// - is a whiteout naming nothing (`.wh.`, `.wh..`).
// Whiteouts (`.wh.NAME`, `.wh..wh..opq`) forget the links they delete, as unpacking does.
// Past `max_bytes` of file contents over all layers the image is too_large.
#pragma once

#include <moat/result.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

struct archive;  // libarchive's reader, kept out of this header's includes

namespace moat::templates {

enum class layer_compression { none, gzip };

// What the layers checked so far left behind: the paths that are symbolic links ("a/b", no
// leading slash), and the bytes and entries counted against the caps.
class layer_checker {
  public:
    static constexpr std::uint64_t max_entries = 2'000'000;
    static constexpr std::size_t max_path_bytes = 4096;

    explicit layer_checker(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}

    // Checks the next layer, read from the file at `path` / from `bytes`. `layer` names it in
    // errors (its digest). invalid_argument naming the entry for what the rules refuse and for an
    // archive that is not a tar of the expected compression.
    result<void> check_file(const std::string& path, layer_compression compression,
                            std::string_view layer);
    result<void> check_bytes(std::string_view bytes, layer_compression compression,
                             std::string_view layer);

    std::uint64_t bytes() const noexcept { return bytes_; }

    // For the archive reader (layer_entries.cpp): one entry, already read.
    struct entry {
        std::string_view path;
        std::string_view hard_link;  // empty unless a hard link
        std::uint32_t type = 0;      // S_IFREG, S_IFDIR, ... (0 for a hard link)
        std::int64_t uid = 0;
        std::int64_t gid = 0;
        std::int64_t size = 0;
    };
    result<void> check_entry(const entry& e, std::string_view layer);

  private:
    result<void> check_archive(struct ::archive* a, layer_compression compression,
                               std::string_view layer);
    result<std::string> normalized(std::string_view path, std::string_view layer) const;
    result<void> check_parents(const std::string& path, std::string_view shown_path,
                               std::string_view layer) const;
    void forget_below(const std::string& path, bool including_itself);

    std::uint64_t max_bytes_;
    std::uint64_t bytes_ = 0;
    std::uint64_t entries_ = 0;
    std::set<std::string> links_;
};

}  // namespace moat::templates
