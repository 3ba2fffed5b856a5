// Templates of the local backend: named, read-only roots a sandbox starts from
// (sandbox_spec::template_name), kept on disk in the data directory (local_options::data_dir).
//
// A template is a stack of layers (today always one); a layer is a directory tree whose owners
// are stored relative to the sandbox, as a sandbox sees them (0 is the sandbox's root, 1000 its
// user), and which a sandbox mounts read-only through an idmapped mount onto its own uid range,
// under an overlay whose upper is a tmpfs of the sandbox's (docs/templates.md). Layers are
// content-addressed: the digest is the SHA-256 of a canonical listing of the tree (every path,
// type, mode, owner, size, content hash and link target, in byte order of the paths), so two
// builds of the same tree share one layer, and a layer can be checked against its name.
//
// What a build takes in, and what it refuses or changes:
// - Regular files, directories, symbolic links (kept as they are: inside the sandbox they resolve
//   against the sandbox's own root) and FIFOs. Hard links become separate copies.
// - Refused, naming the path: device nodes and sockets, an owner or group of 65536 or more (no
//   sandbox id maps it), a tree whose /etc, /dev, /proc, /tmp, /workspace, /home or /root is not a
//   directory, a tree without /bin/sh (nothing could run in it), a tree past max_layer_bytes.
// - Cleared and listed in the report: setuid and setgid bits, and file capabilities
//   (security.capability). Other extended attributes are not copied.
//
// The data directory is 0700 and owned by the process's user (root): nothing in it is meant
// for another host user. The calls here are blocking file system work; the local backend only
// reads a template's record at create.
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

// The template every local sandbox gets when it names none: the host-derived read-only root.
inline constexpr std::string_view base_template_name = "base";

// /var/lib/moat: on disk, unlike the state directory (/run is a tmpfs emptied at boot).
std::string default_data_dir();

struct template_info {
    std::string name;
    std::string digest;  // "sha256:<64 hex>" of its layer
    std::uint64_t size_bytes = 0;
    std::chrono::system_clock::time_point built_at;
    std::string source;  // what it was built from ("dir:/path", "oci:/layout:tag")
    // Its python3 as its sandboxes' PATH finds it, by its real path inside the template
    // (e.g. /usr/bin/python3.11), or "" when it has none: each sandbox of a template with one
    // gets its own Python environment over it (docs/templates.md, "Python in a sandbox").
    std::string python;
};

struct template_build_report {
    template_info built;
    // One line per change the build made to what it copied ("/bin/su: setuid bit cleared").
    std::vector<std::string> cleared;
};

class template_store {
  public:
    // The largest layer a build makes (the sum of its regular files' sizes).
    static constexpr std::uint64_t max_layer_bytes = 16ull << 30;

    // `max_data_bytes`: the data directory's disk budget (0: none but the file system's). A build
    // whose new layer would take the layers past it first deletes the layers no template names
    // and no sandbox uses, then fails with limit_exceeded naming both figures.
    explicit template_store(std::string data_dir = default_data_dir(),
                            std::uint64_t max_data_bytes = 0);

    const std::string& data_dir() const noexcept { return data_dir_; }
    std::uint64_t max_data_bytes() const noexcept { return max_data_bytes_; }

    // The disk space the layers take (allocated blocks of every file, counted once per inode).
    std::uint64_t data_bytes() const;

    // Builds (or rebuilds) template `name` from the tree at `dir`, which is copied: the template
    // never changes when `dir` does. invalid_argument for a bad name ([a-z0-9][a-z0-9._-]*, at
    // most 63 bytes, not "base") or a tree the rules above refuse (the detail names the path);
    // file_not_found when `dir` is missing. A failed build leaves nothing behind; a rebuild
    // replaces the name only once the new layer is whole.
    result<template_build_report> build_from_dir(std::string_view name, const std::string& dir);

    // How long the OCI unpack (umoci) of a build may run before it is killed.
    static constexpr std::chrono::minutes oci_unpack_timeout{30};

    // Builds (or rebuilds) template `name` from image `tag` of the OCI image layout at `layout`
    // (a directory: oci-layout, index.json, blobs/sha256/; a `docker save` archive goes through
    // `skopeo copy docker-archive:FILE oci:DIR:TAG` first). Each blob is copied into the data
    // directory and checked against its digest and size before it is used; each layer (tar or
    // tar+gzip) is checked entry by entry before anything is unpacked, and refused, naming the
    // entry, for a path that is absolute or has a `..` component, for an entry written through a
    // symbolic link (`evil -> /etc` then `evil/passwd`), for a device node or an id past 65535.
    // Debian's umoci then applies the layers (whiteouts included) and the result goes through the
    // rules of a directory build above, flattened into one layer; the record's source is
    // "oci:<layout>:<tag>". Errors as build_from_dir's, and: not_supported for a zstd layer or a
    // multi-platform index, layer_unavailable when umoci is not installed, deadline_exceeded
    // past oci_unpack_timeout. A failed build leaves nothing behind in the data directory.
    result<template_build_report> build_from_oci(std::string_view name, const std::string& layout,
                                                 std::string_view tag = "latest");

    // Every template, by name.
    result<std::vector<template_info>> list() const;

    // The template called `name`; invalid_argument naming it when there is none.
    result<template_info> find(std::string_view name) const;

    // The directory holding `digest`'s tree (what a sandbox mounts).
    std::string layer_root(std::string_view digest) const;

    // A layer's lock file, layer_root + ".lock": every sandbox of the layer, whichever process or
    // state directory made it, holds a shared flock on it for its whole life (its pid 1 keeps
    // the descriptor), and remove() deletes a layer only under an exclusive one.
    static std::string lock_path_of(std::string_view layer_root);

    // Recomputes the digest of the tree on disk (a layer's integrity check).
    result<std::string> digest_of_layer(std::string_view digest) const;

    // Removes template `name`, refused (invalid_argument) while a live sandbox of this host uses
    // its layer (its lock, whatever state directory the sandbox is in) or `in_use` names its
    // digest (the digests of the live sandboxes the caller knows of). Layers no template names
    // and no live sandbox uses are deleted with it.
    result<void> remove(std::string_view name, const std::vector<std::string>& in_use);

  private:
    std::string data_dir_;
    std::uint64_t max_data_bytes_ = 0;
};

}  // namespace moat
