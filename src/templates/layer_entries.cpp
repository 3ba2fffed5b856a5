#include "templates/layer_entries.hpp"

#include "templates/layer_tree.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <memory>

namespace moat::templates {
namespace {

// An entry's path as an error shows it: bounded, control bytes replaced.
std::string shown(std::string_view path) {
    std::string out(path.substr(0, 200));
    for (char& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    if (path.size() > 200) out += "...";
    return out;
}

error refused(std::string_view layer, std::string_view path, const std::string& why) {
    return make_error(errc::invalid_argument, "layer " + std::string(layer.substr(0, 19)) +
                                                  ": entry '" + shown(path) + "': " + why);
}

using archive_ptr = std::unique_ptr<struct archive, int (*)(struct archive*)>;

archive_ptr new_reader(layer_compression compression) {
    archive_ptr a(archive_read_new(), archive_read_free);
    if (!a) return a;
    archive_read_support_format_tar(a.get());  // ustar, pax, GNU tar
    if (compression == layer_compression::gzip) archive_read_support_filter_gzip(a.get());
    return a;
}

}  // namespace

namespace {

// libarchive's message for its last error, which it may not have (a null string).
std::string error_text(struct archive* a) {
    const char* why = archive_error_string(a);
    return why != nullptr ? std::string(why) : std::string("unknown error");
}

}  // namespace

result<void> layer_checker::check_file(const std::string& path, layer_compression compression,
                                       std::string_view layer) {
    archive_ptr a = new_reader(compression);
    if (!a) return make_error(errc::backend_failure, "libarchive: out of memory");
    if (archive_read_open_filename(a.get(), path.c_str(), 64 * 1024) != ARCHIVE_OK)
        return make_error(errc::invalid_argument,
                          "layer " + std::string(layer.substr(0, 19)) + ": " + error_text(a.get()));
    return check_archive(a.get(), compression, layer);
}

result<void> layer_checker::check_bytes(std::string_view bytes, layer_compression compression,
                                        std::string_view layer) {
    archive_ptr a = new_reader(compression);
    if (!a) return make_error(errc::backend_failure, "libarchive: out of memory");
    if (archive_read_open_memory(a.get(), bytes.data(), bytes.size()) != ARCHIVE_OK)
        return make_error(errc::invalid_argument,
                          "layer " + std::string(layer.substr(0, 19)) + ": " + error_text(a.get()));
    return check_archive(a.get(), compression, layer);
}

result<void> layer_checker::check_archive(struct archive* a, layer_compression compression,
                                          std::string_view layer) {
    const auto broken = [a, layer] {
        return make_error(errc::invalid_argument,
                          "layer " + std::string(layer.substr(0, 19)) +
                              ": not a readable tar archive: " + error_text(a));
    };
    bool first = true;
    for (;;) {
        struct archive_entry* e = nullptr;
        const int status = archive_read_next_header(a, &e);
        if (status == ARCHIVE_EOF) break;
        if (status != ARCHIVE_OK && status != ARCHIVE_WARN) return broken();
        if (first) {
            first = false;
            const bool gzip = archive_filter_code(a, 0) == ARCHIVE_FILTER_GZIP;
            if (gzip != (compression == layer_compression::gzip))
                return make_error(errc::invalid_argument,
                                  "layer " + std::string(layer.substr(0, 19)) +
                                      ": its compression is not what its media type says");
        }
        const char* path = archive_entry_pathname(e);
        if (path == nullptr) return refused(layer, "", "an entry without a readable path");
        const char* hard_link = archive_entry_hardlink(e);
        entry one;
        one.path = path;
        if (hard_link != nullptr) one.hard_link = hard_link;
        one.type = archive_entry_filetype(e);
        one.uid = archive_entry_uid(e);
        one.gid = archive_entry_gid(e);
        one.size = archive_entry_size(e);
        if (auto checked = check_entry(one, layer); !checked) return checked;
        if (archive_read_data_skip(a) != ARCHIVE_OK) return broken();
    }
    return {};
}

result<void> layer_checker::check_entry(const entry& e, std::string_view layer) {
    if (++entries_ > max_entries)
        return refused(layer, e.path, "past " + std::to_string(max_entries) + " entries");
    auto path = normalized(e.path, layer);
    if (!path) return path.error();
    if (path->empty()) {
        if (e.type == S_IFDIR && e.hard_link.empty()) return {};
        return refused(layer, e.path, "the root as something other than a directory");
    }
    if (auto through = check_parents(*path, e.path, layer); !through) return through;
    if (e.uid < 0 || e.gid < 0 || e.uid > max_layer_id || e.gid > max_layer_id)
        return refused(layer, e.path,
                       "owned by " + std::to_string(e.uid) + ":" + std::to_string(e.gid) +
                           ", outside a sandbox's ids (0-65535)");
    if (!e.hard_link.empty()) {
        auto target = normalized(e.hard_link, layer);
        if (!target) return target.error();
        if (target->empty()) return refused(layer, e.path, "a hard link to the root");
        if (auto through = check_parents(*target, e.hard_link, layer); !through) return through;
        forget_below(*path, true);
        return {};
    }
    const auto slash = path->rfind('/');
    const std::string parent = slash == std::string::npos ? "" : path->substr(0, slash);
    const std::string_view name =
        std::string_view(*path).substr(slash == std::string::npos ? 0 : slash + 1);
    if (name.starts_with(".wh.")) {
        if (name == ".wh..wh..opq") {
            forget_below(parent, false);
            return {};
        }
        const std::string_view hidden = name.substr(4);
        if (hidden.empty() || hidden == "." || hidden == "..")
            return refused(layer, e.path, "a whiteout that names nothing");
        forget_below(parent.empty() ? std::string(hidden) : parent + "/" + std::string(hidden),
                     true);
        return {};
    }
    switch (e.type) {
        case S_IFREG:
            if (e.size > 0) bytes_ += static_cast<std::uint64_t>(e.size);
            if (bytes_ > max_bytes_)
                return make_error(errc::too_large, "the image's layers are past the limit of " +
                                                       std::to_string(max_bytes_) + " bytes");
            forget_below(*path, true);
            return {};
        case S_IFDIR:
            links_.erase(*path);
            return {};
        case S_IFLNK:
            forget_below(*path, true);
            links_.insert(*path);
            return {};
        case S_IFIFO:
            forget_below(*path, true);
            return {};
        case S_IFCHR:
        case S_IFBLK:
            return refused(layer, e.path,
                           "a device node (a template holds none; /dev is the sandbox's own)");
        default:
            return refused(layer, e.path, "a socket or an unknown type (a template holds none)");
    }
}

result<std::string> layer_checker::normalized(std::string_view path, std::string_view layer) const {
    if (path.size() > max_path_bytes)
        return refused(layer, path, "a path past " + std::to_string(max_path_bytes) + " bytes");
    if (path.starts_with('/'))
        return refused(layer, path, "an absolute path (it would land outside the root)");
    std::string out;
    std::size_t at = 0;
    while (at <= path.size()) {
        std::size_t end = path.find('/', at);
        if (end == std::string_view::npos) end = path.size();
        const std::string_view part = path.substr(at, end - at);
        at = end + 1;
        if (part.empty() || part == ".") continue;
        if (part == "..")
            return refused(layer, path, "a '..' component (it would land outside the root)");
        if (!out.empty()) out += '/';
        out += part;
    }
    return out;
}

result<void> layer_checker::check_parents(const std::string& path, std::string_view shown_path,
                                          std::string_view layer) const {
    if (links_.empty()) return {};
    for (std::size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
        const std::string parent = path.substr(0, slash);
        if (links_.count(parent) != 0)
            return refused(layer, shown_path,
                           "written through the symbolic link /" + shown(parent) +
                               " (it could land outside the root)");
    }
    return {};
}

void layer_checker::forget_below(const std::string& path, bool including_itself) {
    if (path.empty()) {
        links_.clear();
        return;
    }
    if (including_itself) links_.erase(path);
    // Every "path/..." sorts in ["path/", "path0"): '0' follows '/'.
    links_.erase(links_.lower_bound(path + "/"), links_.lower_bound(path + "0"));
}

}  // namespace moat::templates
