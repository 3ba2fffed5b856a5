// The data directory's templates (templates.hpp):
//
//   <data_dir>/                  0700
//     layers/<hex>/              a layer's tree, named by its digest (content-addressed)
//     templates/<name>.json      {"name","digest","size_bytes","built_at_ms","source","python"}
//     staging/<random>/          a build under way (removed whatever its outcome); an OCI build's
//                                holds image/ (the checked blobs), rootfs/ (umoci's) and layer/
//
// A build copies into staging, checks the root, computes the digest, renames the tree into
// layers/ (or drops it when that layer exists), and only then writes the template's record
// (a temporary file renamed over it): a reader sees the old template or the new, never half.
#include <moat/templates.hpp>

#include "core/ascii.hpp"
#include "core/json_writer.hpp"
#include "core/unique_fd.hpp"
#include "templates/layer_python.hpp"
#include "templates/layer_tree.hpp"
#include "templates/oci_image.hpp"
#include "templates/oci_layout.hpp"
#include "wire/protocol.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <simdjson.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

namespace moat {
namespace {

constexpr std::size_t max_name_bytes = 63;
constexpr std::size_t max_record_bytes = 64 * 1024;

bool valid_name(std::string_view name) {
    if (name.empty() || name.size() > max_name_bytes) return false;
    const auto lower_or_digit = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    };
    if (!lower_or_digit(name[0])) return false;
    return std::all_of(name.begin(), name.end(), [&](char c) {
        return lower_or_digit(c) || c == '.' || c == '_' || c == '-';
    });
}

result<void> check_name(std::string_view name) {
    if (name == base_template_name)
        return make_error(errc::invalid_argument,
                          "template name 'base' is the host-derived default root; choose another");
    if (!valid_name(name))
        return make_error(errc::invalid_argument,
                          "template name '" + std::string(name.substr(0, 80)) +
                              "' is not [a-z0-9][a-z0-9._-]* of at most 63 bytes");
    return {};
}

result<void> make_dir(const std::string& path, mode_t mode) {
    if (::mkdir(path.c_str(), mode) == 0 || errno == EEXIST) return {};
    return make_error(errc::backend_failure,
                      "template store: mkdir " + path + ": " + std::strerror(errno));
}

std::int64_t unix_ms(std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::string record_json(const template_info& t) {
    json_writer w;
    w.begin_object();
    w.key("name").value(t.name);
    w.key("digest").value(t.digest);
    w.key("size_bytes").value(t.size_bytes);
    w.key("built_at_ms").value(unix_ms(t.built_at));
    w.key("source").value(t.source);
    w.key("python").value(t.python);
    w.end_object();
    return w.take();
}

result<template_info> parse_record(std::string_view json, const std::string& path) {
    const auto bad = [&path](const char* field) {
        return make_error(errc::backend_failure,
                          "template record " + path + ": missing or bad \"" + field + "\"");
    };
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) return bad("(top level)");
    template_info t;
    std::string_view text;
    if (o["name"].get_string().get(text) != simdjson::SUCCESS || !valid_name(text))
        return bad("name");
    t.name = text;
    if (o["digest"].get_string().get(text) != simdjson::SUCCESS ||
        !templates::valid_blob_digest(text))
        return bad("digest");
    t.digest = text;
    if (o["size_bytes"].get_uint64().get(t.size_bytes) != simdjson::SUCCESS)
        return bad("size_bytes");
    std::int64_t built = 0;
    if (o["built_at_ms"].get_int64().get(built) != simdjson::SUCCESS) return bad("built_at_ms");
    t.built_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(built));
    if (o["source"].get_string().get(text) != simdjson::SUCCESS) return bad("source");
    t.source = text;
    // Records written before templates had Python environments have none.
    if (o["python"].get_string().get(text) == simdjson::SUCCESS) t.python = text;
    return t;
}

result<void> write_atomically(const std::string& path, const std::string& text) {
    const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
    unique_fd fd(
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.is_open())
        return make_error(errc::backend_failure, temporary + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::unlink(temporary.c_str());
            return make_error(errc::backend_failure, temporary + ": " + std::strerror(err));
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(temporary.c_str());
        return make_error(errc::backend_failure, path + ": " + std::strerror(err));
    }
    return {};
}

std::string random_hex() {
    unsigned char bytes[8];
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) return {};
    return detail::hex_encoded(bytes);
}

// The names of a directory's entries ending in `suffix` (without it).
std::vector<std::string> names_in(const std::string& dir, std::string_view suffix) {
    std::vector<std::string> out;
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return out;
    while (const dirent* e = ::readdir(d.get())) {
        std::string_view name = e->d_name;
        if (name == "." || name == ".." || !name.ends_with(suffix)) continue;
        name.remove_suffix(suffix.size());
        out.emplace_back(name);
    }
    std::sort(out.begin(), out.end());
    return out;
}

// A fresh path under <data_dir>/staging/ for one build (the store's directories made first).
result<std::string> new_staging(const std::string& data_dir) {
    for (const char* sub : {"", "/layers", "/templates", "/staging"}) {
        if (auto made = make_dir(data_dir + sub, 0700); !made) return made.error();
    }
    const std::string random = random_hex();
    if (random.empty()) return make_error(errc::backend_failure, "getrandom failed");
    return data_dir + "/staging/" + random;
}

// The layer's lock taken exclusively, or an unopened descriptor while a sandbox holds it shared.
unique_fd lock_unused(const std::string& layer_root) {
    const std::string path = template_store::lock_path_of(layer_root);
    unique_fd lock(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (lock.is_open() && ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) lock.reset();
    return lock;
}

// The allocated bytes of every file under `root` (each inode once, links not followed).
std::uint64_t disk_bytes(const std::string& root) {
    static thread_local std::uint64_t total;
    static thread_local std::set<std::pair<dev_t, ino_t>>* seen;
    std::set<std::pair<dev_t, ino_t>> inodes;
    total = 0;
    seen = &inodes;
    ::nftw(
        root.c_str(),
        [](const char*, const struct stat* st, int, FTW*) {
            if (seen->emplace(st->st_dev, st->st_ino).second)
                total += static_cast<std::uint64_t>(st->st_blocks) * 512;
            return 0;
        },
        64, FTW_PHYS | FTW_MOUNT);
    seen = nullptr;
    return total;
}

std::string mib_text(std::uint64_t bytes) {
    return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

// Deletes the layers no template names, `kept` does not name and no sandbox holds (their
// locks free), with their lock files.
void collect_unused_layers(const template_store& store, std::set<std::string> kept) {
    auto templates_now = store.list();
    if (!templates_now) return;  // unreadable records: delete nothing
    for (const auto& t : *templates_now) kept.insert(t.digest);
    for (const auto& hex : names_in(store.data_dir() + "/layers", "")) {
        const std::string digest = "sha256:" + hex;
        if (!templates::valid_blob_digest(digest) || kept.count(digest) != 0) continue;
        const std::string root = store.layer_root(digest);
        const unique_fd unused = lock_unused(root);
        if (!unused.is_open()) continue;
        templates::remove_tree(root);
        ::unlink(template_store::lock_path_of(root).c_str());
    }
}

// Room in the budget for the staged layer: unused layers go first, then the build fails.
result<void> make_room(const template_store& store, const std::string& staging) {
    if (store.max_data_bytes() == 0) return {};
    const std::uint64_t needed = disk_bytes(staging);
    if (store.data_bytes() + needed <= store.max_data_bytes()) return {};
    collect_unused_layers(store, {});
    const std::uint64_t used = store.data_bytes();
    if (used + needed <= store.max_data_bytes()) return {};
    return make_error(errc::limit_exceeded,
                      "the data directory's budget is " + mib_text(store.max_data_bytes()) +
                          ": its layers take " + mib_text(used) + " and this one " +
                          mib_text(needed) + " (remove a template: moat template rm)");
}

// Every build's last step: copies the root at `dir` into a layer (at `staging` first), and names
// it `name` with the record's `source`.
result<template_build_report> build_layer(const template_store& store, std::string_view name,
                                          const std::string& dir, std::string source,
                                          const std::string& staging) {
    const auto abandon = [&staging](error e) {
        templates::remove_tree(staging);
        return e;
    };
    auto copied = templates::copy_tree(dir, staging, template_store::max_layer_bytes);
    if (!copied) return abandon(copied.error());
    if (auto checked = templates::check_root(staging); !checked) return abandon(checked.error());
    auto digest = templates::tree_digest(staging);
    if (!digest) return abandon(digest.error());
    const std::string layer = store.layer_root(*digest);
    if (::access(layer.c_str(), F_OK) != 0) {
        if (auto room = make_room(store, staging); !room) return abandon(room.error());
    }
    if (::rename(staging.c_str(), layer.c_str()) != 0) {
        const int err = errno;
        // The same tree was built before: its layer is already there.
        if (err != EEXIST && err != ENOTEMPTY)
            return abandon(make_error(errc::backend_failure, "rename " + staging + " to " + layer +
                                                                 ": " + std::strerror(err)));
        templates::remove_tree(staging);
    }
    template_build_report report;
    report.built.name = name;
    report.built.digest = *digest;
    report.built.size_bytes = copied->bytes;
    report.built.built_at = std::chrono::system_clock::now();
    report.built.source = std::move(source);
    report.built.python = templates::find_python(layer);
    report.cleared = std::move(copied->cleared);
    const std::string record = store.data_dir() + "/templates/" + std::string(name) + ".json";
    if (auto written = write_atomically(record, record_json(report.built)); !written)
        return written.error();
    return report;
}

}  // namespace

std::string default_data_dir() {
    if (::geteuid() == 0) return "/var/lib/moat";
    if (const char* data = std::getenv("XDG_DATA_HOME"); data && data[0] == '/')
        return std::string(data) + "/moat";
    if (const char* home = std::getenv("HOME"); home && home[0] == '/')
        return std::string(home) + "/.local/share/moat";
    return "/tmp/moat-data-" + std::to_string(::geteuid());
}

template_store::template_store(std::string data_dir, std::uint64_t max_data_bytes)
    : data_dir_(std::move(data_dir)), max_data_bytes_(max_data_bytes) {}

std::string template_store::lock_path_of(std::string_view layer_root) {
    return std::string(layer_root).append(wire::layer_lock_suffix);
}

std::uint64_t template_store::data_bytes() const {
    return disk_bytes(data_dir_ + "/layers");
}

result<template_build_report> template_store::build_from_dir(std::string_view name,
                                                             const std::string& dir) {
    if (auto ok = check_name(name); !ok) return ok.error();
    auto staging = new_staging(data_dir_);
    if (!staging) return staging.error();
    return build_layer(*this, name, dir, "dir:" + dir, *staging);
}

result<template_build_report> template_store::build_from_oci(std::string_view name,
                                                             const std::string& layout,
                                                             std::string_view tag) {
    if (auto ok = check_name(name); !ok) return ok.error();
    const auto deadline = std::chrono::steady_clock::now() + oci_unpack_timeout;
    auto work = new_staging(data_dir_);
    if (!work) return work.error();
    if (::mkdir(work->c_str(), 0700) != 0)
        return make_error(errc::backend_failure, "mkdir " + *work + ": " + std::strerror(errno));
    const auto built = [&]() -> result<template_build_report> {
        if (auto staged =
                templates::stage_oci_image(layout, tag, *work + "/image", max_layer_bytes);
            !staged)
            return staged.error();
        if (auto unpacked = templates::unpack_oci_image(*work, "image", tag, "rootfs", deadline);
            !unpacked)
            return unpacked.error();
        return build_layer(*this, name, *work + "/rootfs", "oci:" + layout + ":" + std::string(tag),
                           *work + "/layer");
    }();
    templates::remove_tree(*work);
    return built;
}

result<std::vector<template_info>> template_store::list() const {
    std::vector<template_info> out;
    for (const auto& name : names_in(data_dir_ + "/templates", ".json")) {
        if (!valid_name(name)) continue;
        auto found = find(name);
        if (!found) {
            if (found.error().code == errc::invalid_argument) continue;  // removed meanwhile
            return found.error();
        }
        out.push_back(std::move(*found));
    }
    return out;
}

result<template_info> template_store::find(std::string_view name) const {
    if (!valid_name(name) || name == base_template_name)
        return make_error(errc::invalid_argument,
                          "template '" + std::string(name.substr(0, 80)) + "' does not exist");
    const std::string path = data_dir_ + "/templates/" + std::string(name) + ".json";
    auto text = templates::read_small_file(path, max_record_bytes);
    if (!text) {
        if (text.error().code == errc::file_not_found)
            return make_error(errc::invalid_argument,
                              "template '" + std::string(name) +
                                  "' does not exist (moat template ls lists them)");
        // An oversized record is the store's fault, not the caller's.
        return make_error(errc::backend_failure, text.error().detail);
    }
    return parse_record(*text, path);
}

std::string template_store::layer_root(std::string_view digest) const {
    constexpr std::string_view prefix = "sha256:";
    if (digest.starts_with(prefix)) digest.remove_prefix(prefix.size());
    return data_dir_ + "/layers/" + std::string(digest);
}

result<std::string> template_store::digest_of_layer(std::string_view digest) const {
    if (!templates::valid_blob_digest(digest))
        return make_error(errc::invalid_argument, "not a layer digest: " + std::string(digest));
    return templates::tree_digest(layer_root(digest));
}

result<void> template_store::remove(std::string_view name, const std::vector<std::string>& in_use) {
    auto found = find(name);
    if (!found) return found.error();
    const auto in_use_error = [&name] {
        return make_error(
            errc::invalid_argument,
            "template '" + std::string(name) + "' is in use by a live sandbox; destroy it first");
    };
    if (std::find(in_use.begin(), in_use.end(), found->digest) != in_use.end())
        return in_use_error();
    // Held until the record is gone: a create that reads the record before then holds the lock
    // first (the helper takes it before the layer is mounted) and keeps the template.
    const unique_fd held = lock_unused(layer_root(found->digest));
    if (!held.is_open()) return in_use_error();
    const std::string record = data_dir_ + "/templates/" + std::string(name) + ".json";
    if (::unlink(record.c_str()) != 0 && errno != ENOENT)
        return make_error(errc::backend_failure, record + ": " + std::strerror(errno));
    // Layers no template names and no live sandbox uses (their locks free); this one's lock is
    // held here, so it goes unless another template names it.
    std::set<std::string> kept(in_use.begin(), in_use.end());
    auto remaining = list();
    if (!remaining) return remaining.error();
    const bool still_named =
        std::any_of(remaining->begin(), remaining->end(),
                    [&found](const template_info& t) { return t.digest == found->digest; });
    if (!still_named && kept.count(found->digest) == 0) {
        const std::string root = layer_root(found->digest);
        templates::remove_tree(root);
        ::unlink(lock_path_of(root).c_str());
    }
    collect_unused_layers(*this, std::move(kept));
    return {};
}

}  // namespace moat
