// Templates from an OCI image layout (template_store::build_from_oci): the test writes the image
// itself (tar layers through libarchive, blobs named by their SHA-256, index.json, manifest and
// config as text) around a static busybox root; umoci unpacks it, and a sandbox runs on it. Images
// that try to leave the root, or whose blobs are not what they claim, are refused before anything
// is unpacked, naming the entry or the blob, and leave nothing in the data directory's staging.
#include "support/moat_cli.hpp"
#include "support/template_fixture.hpp"
#include "templates/layer_entries.hpp"
#include "templates/sha256.hpp"
#include "templates/tool_process.hpp"

#include <moat/templates.hpp>

#include <archive.h>
#include <archive_entry.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

namespace fs = std::filesystem;
using moat::test::busybox;
using moat::test::scratch_dir;
using moat::test::template_fixture;

namespace {

// One tar entry: a file (`text` its content), a directory, a symbolic link (`text` its target),
// a hard link (`text` its target path) or a character device.
struct tar_entry {
    enum kind { file, directory, symlink, hard_link, device } type = file;
    std::string path;
    std::string text;
    unsigned mode = 0644;
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// A tar archive of `entries` (owner 0:0).
std::string tar_of(const std::vector<tar_entry>& entries) {
    std::string out;
    std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_write_new(),
                                                                archive_write_free);
    REQUIRE(archive_write_set_format_pax_restricted(a.get()) == ARCHIVE_OK);
    const auto append = [](struct archive*, void* to, const void* bytes, size_t n) -> la_ssize_t {
        static_cast<std::string*>(to)->append(static_cast<const char*>(bytes), n);
        return static_cast<la_ssize_t>(n);
    };
    REQUIRE(archive_write_open(a.get(), &out, nullptr, append, nullptr) == ARCHIVE_OK);
    for (const auto& e : entries) {
        std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> entry(
            archive_entry_new(), archive_entry_free);
        archive_entry_set_pathname(entry.get(), e.path.c_str());
        archive_entry_set_uid(entry.get(), 0);
        archive_entry_set_gid(entry.get(), 0);
        archive_entry_set_perm(entry.get(), e.mode);
        archive_entry_set_mtime(entry.get(), 1'700'000'000, 0);
        switch (e.type) {
            case tar_entry::file:
                archive_entry_set_filetype(entry.get(), AE_IFREG);
                archive_entry_set_size(entry.get(), static_cast<la_int64_t>(e.text.size()));
                break;
            case tar_entry::directory:
                archive_entry_set_filetype(entry.get(), AE_IFDIR);
                break;
            case tar_entry::symlink:
                archive_entry_set_filetype(entry.get(), AE_IFLNK);
                archive_entry_set_symlink(entry.get(), e.text.c_str());
                break;
            case tar_entry::hard_link:
                archive_entry_set_filetype(entry.get(), AE_IFREG);
                archive_entry_set_hardlink(entry.get(), e.text.c_str());
                break;
            case tar_entry::device:
                archive_entry_set_filetype(entry.get(), AE_IFCHR);
                archive_entry_set_rdevmajor(entry.get(), 1);
                archive_entry_set_rdevminor(entry.get(), 3);
                break;
        }
        REQUIRE(archive_write_header(a.get(), entry.get()) == ARCHIVE_OK);
        if (e.type == tar_entry::file && !e.text.empty())
            REQUIRE(archive_write_data(a.get(), e.text.data(), e.text.size()) ==
                    static_cast<la_ssize_t>(e.text.size()));
    }
    REQUIRE(archive_write_close(a.get()) == ARCHIVE_OK);
    return out;
}

std::string sha256_of(std::string_view bytes) {
    moat::templates::sha256 hash;
    hash.add(bytes);
    return "sha256:" + hash.hex();
}

// An OCI image layout the test writes: blobs named by their digest, one manifest under `tag`.
struct oci_layout {
    fs::path dir;

    std::string put_blob(const std::string& bytes) const {
        const std::string digest = sha256_of(bytes);
        fs::create_directories(dir / "blobs/sha256");
        std::ofstream(dir / "blobs/sha256" / digest.substr(7), std::ios::binary) << bytes;
        return digest;
    }

    static std::string descriptor(const std::string& type, const std::string& digest,
                                  std::size_t size) {
        return R"({"mediaType":")" + type + R"(","digest":")" + digest + R"(","size":)" +
               std::to_string(size) + "}";
    }

    // Writes the image: layers as (tar, gzip?) pairs, bottom first. The layers' digests.
    std::vector<std::string> write(const std::vector<std::pair<std::string, bool>>& layers,
                                   const std::string& tag = "latest") const {
        std::string diff_ids;
        std::string layer_list;
        std::vector<std::string> digests;
        for (const auto& [tar, gzip] : layers) {
            const std::string blob = gzip ? tar_of_gzip(tar) : tar;
            const std::string digest = put_blob(blob);
            digests.push_back(digest);
            if (!diff_ids.empty()) diff_ids += ",";
            diff_ids += "\"" + sha256_of(tar) + "\"";
            if (!layer_list.empty()) layer_list += ",";
            layer_list += descriptor(gzip ? "application/vnd.oci.image.layer.v1.tar+gzip"
                                          : "application/vnd.oci.image.layer.v1.tar",
                                     digest, blob.size());
        }
        const std::string config = R"({"architecture":"amd64","os":"linux","config":{},)"
                                   R"("rootfs":{"type":"layers","diff_ids":[)" +
                                   diff_ids + "]}}";
        const std::string manifest =
            R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
            R"("config":)" +
            descriptor("application/vnd.oci.image.config.v1+json", put_blob(config),
                       config.size()) +
            R"(,"layers":[)" + layer_list + "]}";
        // The manifest's descriptor, tagged.
        const std::string manifest_entry = descriptor("application/vnd.oci.image.manifest.v1+json",
                                                      put_blob(manifest), manifest.size());
        const std::string tagged = manifest_entry.substr(0, manifest_entry.size() - 1) +
                                   R"(,"annotations":{"org.opencontainers.image.ref.name":")" +
                                   tag + "\"}}";
        std::ofstream(dir / "index.json") << R"({"schemaVersion":2,"manifests":[)" + tagged + "]}";
        std::ofstream(dir / "oci-layout") << R"({"imageLayoutVersion":"1.0.0"})";
        return digests;
    }

    // The same tar, gzip-compressed (a tar of one archive's entries would re-encode them).
    static std::string tar_of_gzip(const std::string& tar) {
        std::string out;
        std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_write_new(),
                                                                    archive_write_free);
        REQUIRE(archive_write_set_format_raw(a.get()) == ARCHIVE_OK);
        REQUIRE(archive_write_add_filter_gzip(a.get()) == ARCHIVE_OK);
        // No zero padding after the gzip stream (a reader would take it for a second member).
        REQUIRE(archive_write_set_bytes_in_last_block(a.get(), 1) == ARCHIVE_OK);
        const auto append = [](struct archive*, void* to, const void* bytes,
                               size_t n) -> la_ssize_t {
            static_cast<std::string*>(to)->append(static_cast<const char*>(bytes), n);
            return static_cast<la_ssize_t>(n);
        };
        REQUIRE(archive_write_open(a.get(), &out, nullptr, append, nullptr) == ARCHIVE_OK);
        std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> entry(
            archive_entry_new(), archive_entry_free);
        archive_entry_set_filetype(entry.get(), AE_IFREG);
        archive_entry_set_pathname(entry.get(), "layer");
        REQUIRE(archive_write_header(a.get(), entry.get()) == ARCHIVE_OK);
        REQUIRE(archive_write_data(a.get(), tar.data(), tar.size()) ==
                static_cast<la_ssize_t>(tar.size()));
        REQUIRE(archive_write_close(a.get()) == ARCHIVE_OK);
        return out;
    }
};

// The lower layer: a static busybox root with /etc/motd, /etc/gone (which the upper layer's
// whiteout deletes) and /usr/lib/data.
std::vector<tar_entry> busybox_layer() {
    std::vector<tar_entry> entries = {
        {tar_entry::directory, "./", "", 0755},
        {tar_entry::directory, "bin/", "", 0755},
        {tar_entry::file, "bin/busybox", read_file(busybox), 0755},
    };
    for (const char* applet : {"sh", "ls", "cat", "stat", "readlink", "true"})
        entries.push_back({tar_entry::symlink, std::string("bin/") + applet, "busybox", 0777});
    entries.push_back({tar_entry::directory, "etc/", "", 0755});
    entries.push_back({tar_entry::file, "etc/motd", "from the image\n"});
    entries.push_back({tar_entry::file, "etc/gone", "deleted by the upper layer\n"});
    entries.push_back({tar_entry::directory, "usr/", "", 0755});
    entries.push_back({tar_entry::directory, "usr/lib/", "", 0755});
    entries.push_back({tar_entry::file, "usr/lib/data", "image data\n"});
    return entries;
}

// The upper layer: a whiteout of /etc/gone and a file of its own.
std::vector<tar_entry> upper_layer() {
    return {{tar_entry::directory, "etc/", "", 0755},
            {tar_entry::file, "etc/.wh.gone", ""},
            {tar_entry::file, "etc/added", "from the upper layer\n"}};
}

struct oci_fixture : template_fixture {
    fs::path layout_dir(const std::string& name) { return scratch.path / name; }

    // Builds `layers` (each a list of entries, bottom first) into an image and from it template
    // `name`; the outcome.
    moat::result<moat::template_build_report> build_image(
        const std::string& name, const std::vector<std::vector<tar_entry>>& layers) {
        oci_layout image{layout_dir(name)};
        std::vector<std::pair<std::string, bool>> tars;
        for (const auto& layer : layers) tars.emplace_back(tar_of(layer), false);
        image.write(tars);
        return store.build_from_oci(name, image.dir.string());
    }

    void check_nothing_left(const std::string& name) {
        CHECK_FALSE(store.find(name));
        CHECK(fs::is_empty(store.data_dir() + "/staging"));
    }

    void check_refused(const std::string& name, const std::vector<std::vector<tar_entry>>& layers,
                       const std::string& needle) {
        auto built = build_image(name, layers);
        REQUIRE_FALSE(built);
        CHECK(built.error().code == moat::errc::invalid_argument);
        CHECK_MESSAGE(built.error().detail.find(needle) != std::string::npos, built.error().detail);
        check_nothing_left(name);
    }
};

}  // namespace

TEST_CASE_FIXTURE(oci_fixture,
                  "a template from an OCI image applies its layers in order with their "
                  "whiteouts, and the sandbox sees the image, not the host") {
    MOAT_REQUIRE_NAMESPACES();
    oci_layout image{layout_dir("img")};
    image.write({{tar_of(busybox_layer()), false}, {tar_of(upper_layer()), true}});
    auto built = store.build_from_oci("img", image.dir.string());
    REQUIRE_MESSAGE(built, built.error().to_string());
    CHECK(built->built.source == "oci:" + image.dir.string() + ":latest");
    CHECK(built->built.digest.starts_with("sha256:"));
    CHECK(fs::is_empty(store.data_dir() + "/staging"));
    // The layer holds the result of both layers: no whiteout file, no deleted file.
    const std::string layer = store.layer_root(built->built.digest);
    CHECK_FALSE(fs::exists(layer + "/etc/gone"));
    CHECK_FALSE(fs::exists(layer + "/etc/.wh.gone"));
    CHECK(fs::exists(layer + "/etc/added"));

    const auto box = create_from("img");
    CHECK(box.template_digest == built->built.digest);
    const auto seen = sh(box.id,
                         "busybox sh -c 'cat /etc/motd /etc/added /usr/lib/data; "
                         "cat /etc/gone 2>/dev/null || echo no gone; "
                         "ls /usr/bin 2>/dev/null || echo no usr-bin; readlink /bin/sh'");
    CHECK_MESSAGE(seen.exit_code == 0, seen.err.text());
    CHECK(seen.out.text() ==
          "from the image\nfrom the upper layer\nimage data\nno gone\nno usr-bin\nbusybox\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(oci_fixture,
                  "an OCI image whose entries leave the root is refused naming the entry, before "
                  "anything is unpacked") {
    REQUIRE(::access(busybox, X_OK) == 0);
    // The busybox layer and `extra` after it.
    const auto with = [](std::vector<tar_entry> extra) {
        auto entries = busybox_layer();
        entries.insert(entries.end(), extra.begin(), extra.end());
        return entries;
    };
    // A `..` component, an absolute path.
    check_refused("dotdot", {with({{tar_entry::file, "../escape", "out\n"}})},
                  "entry '../escape': a '..' component");
    check_refused("nested", {with({{tar_entry::file, "etc/../../escape", "out\n"}})},
                  "entry 'etc/../../escape'");
    check_refused("absolute", {with({{tar_entry::file, "/escape", "out\n"}})},
                  "entry '/escape': an absolute path");
    // A file written through an absolute link, in the same layer and in the next one.
    const tar_entry evil{tar_entry::symlink, "evil", "/etc"};
    const tar_entry passwd{tar_entry::file, "evil/passwd", "root::0:0::/:/bin/sh\n"};
    check_refused("evil", {with({evil, passwd})},
                  "entry 'evil/passwd': written through the symbolic link /evil");
    check_refused("evil-next", {with({evil}), {passwd}},
                  "entry 'evil/passwd': written through the symbolic link /evil");
    // A relative link that climbs out, and a hard link through it.
    const tar_entry up{tar_entry::symlink, "etc/up", "../../../.."};
    check_refused("up", {with({up, {tar_entry::directory, "etc/up/tmp/", "", 0755}})},
                  "entry 'etc/up/tmp/': written through the symbolic link /etc/up");
    check_refused("hardlink", {with({up, {tar_entry::hard_link, "etc/h", "etc/up/etc/shadow"}})},
                  "entry 'etc/up/etc/shadow': written through");
    // A device node.
    check_refused("device", {with({{tar_entry::device, "etc/null", ""}})},
                  "entry 'etc/null': a device node");
    // Nothing was written outside the image's root.
    CHECK_FALSE(fs::exists(scratch.path / "escape"));
    CHECK_FALSE(fs::exists(store.data_dir() + "/escape"));
    CHECK_FALSE(fs::exists(store.data_dir() + "/staging/escape"));

    // A whiteout of the link, or a directory in its place, makes the path a plain one again.
    moat::templates::layer_checker checker(1 << 20);
    const std::string relinked = tar_of({{tar_entry::symlink, "a", "/etc"},
                                         {tar_entry::file, ".wh.a", ""},
                                         {tar_entry::directory, "a/", "", 0755},
                                         {tar_entry::file, "a/passwd", "x\n"}});
    CHECK(checker.check_bytes(relinked, moat::templates::layer_compression::none, "test"));
    auto gzip_claimed =
        checker.check_bytes(relinked, moat::templates::layer_compression::gzip, "test");
    CHECK_FALSE(gzip_claimed);
}

TEST_CASE_FIXTURE(oci_fixture,
                  "an OCI image whose blob is not what its digest says, or that a template cannot "
                  "take, is refused and leaves nothing behind") {
    REQUIRE(::access(busybox, X_OK) == 0);
    oci_layout image{layout_dir("altered")};
    const auto digests = image.write({{tar_of(busybox_layer()), false}});
    // One byte of the layer changed, its name kept.
    const fs::path blob = image.dir / "blobs/sha256" / digests[0].substr(7);
    std::string bytes = read_file(blob);
    bytes[bytes.size() / 2] ^= 1;
    std::ofstream(blob, std::ios::binary | std::ios::trunc) << bytes;
    auto altered = store.build_from_oci("altered", image.dir.string());
    REQUIRE_FALSE(altered);
    CHECK(altered.error().code == moat::errc::invalid_argument);
    CHECK_MESSAGE(
        altered.error().detail.find("blob " + digests[0].substr(0, 19) +
                                    ": its content does not match its digest") != std::string::npos,
        altered.error().detail);
    check_nothing_left("altered");

    // An unknown tag, a missing layout, a layer without /bin/sh.
    oci_layout good{layout_dir("good")};
    good.write({{tar_of(busybox_layer()), false}});
    auto untagged = store.build_from_oci("untagged", good.dir.string(), "v2");
    REQUIRE_FALSE(untagged);
    CHECK(untagged.error().detail.find("no manifest is tagged 'v2'") != std::string::npos);
    auto missing = store.build_from_oci("missing", (scratch.path / "nowhere").string());
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::file_not_found);
    auto no_shell = busybox_layer();
    no_shell.erase(std::remove_if(no_shell.begin(), no_shell.end(),
                                  [](const tar_entry& e) { return e.path == "bin/sh"; }),
                   no_shell.end());
    check_refused("noshell", {no_shell}, "/bin/sh: missing");
    check_nothing_left("untagged");
    std::size_t layers = 0;
    for (const auto& entry : fs::directory_iterator(store.data_dir() + "/layers")) {
        (void)entry;
        ++layers;
    }
    CHECK(layers == 0);
}

TEST_CASE("moat template build --from-oci and moat template ls, as a user runs them") {
    MOAT_REQUIRE_NAMESPACES();
    REQUIRE(::access(busybox, X_OK) == 0);
    scratch_dir scratch;
    oci_layout image{scratch.path / "image"};
    image.write({{tar_of(busybox_layer()), false}, {tar_of(upper_layer()), true}}, "v1");
    const std::string env = "MOAT_DATA_DIR=" + (scratch.path / "data").string();
    const auto built =
        moat::test::moat_cli(env, "template build x --from-oci " + image.dir.string() + ":v1");
    CHECK_MESSAGE(built.exit_code == 0, built.output);
    CHECK(built.output.find("built x sha256:") != std::string::npos);
    const auto listed = moat::test::moat_cli(env, "template ls");
    CHECK(listed.exit_code == 0);
    CHECK_MESSAGE(listed.output.find("\nx ") != std::string::npos, listed.output);
    CHECK(listed.output.find("oci:" + image.dir.string() + ":v1") != std::string::npos);
    const auto ran = moat::test::moat_cli(env, "run --template x -- cat /etc/added");
    CHECK(ran.exit_code == 0);
    CHECK(ran.output == "from the upper layer\n");
    const auto untagged =
        moat::test::moat_cli(env, "template build y --from-oci " + image.dir.string());
    CHECK(untagged.exit_code != 0);
    CHECK(untagged.output.find("no manifest is tagged 'latest'") != std::string::npos);
}

TEST_CASE(
    "the build's program runner kills a program past its deadline with its process group, "
    "and its error shows one line of the program's stderr") {
    using moat::templates::run_tool;
    scratch_dir scratch;
    const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(20); };
    // Only the last line, without the terminal's colours.
    auto failed = run_tool({"sh", "-c",
                            "echo first line >&2; printf '\\033[31m x boom\\033[0m\\n\\n' >&2; "
                            "exit 3"},
                           scratch.path.string(), soon());
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == moat::errc::backend_failure);
    CHECK(failed.error().detail == "sh failed (exit 3): x boom");
    // Its environment is PATH and LC_ALL alone, its working directory the one given.
    ::setenv("MOAT_TOOL_TEST_SECRET", "s3cret", 1);
    auto env =
        run_tool({"sh", "-c", "env | grep -v '^PWD=' | sort | tr '\\n' ' ' >&2; pwd >&2; exit 1"},
                 scratch.path.string(), soon());
    ::unsetenv("MOAT_TOOL_TEST_SECRET");
    REQUIRE_FALSE(env);
    CHECK(env.error().detail.find("s3cret") == std::string::npos);
    CHECK(env.error().detail ==
          "sh failed (exit 1): LC_ALL=C "
          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin " +
              scratch.path.string());
    CHECK(run_tool({"true"}, "/", soon()));
    auto missing = run_tool({"moat-no-such-program"}, "/", soon());
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::layer_unavailable);

    // A program and the child it started, killed together at the deadline.
    const auto pid_file = scratch.path / "child.pid";
    const auto started = std::chrono::steady_clock::now();
    auto late = run_tool({"sh", "-c", "sleep 60 & echo $! > " + pid_file.string() + "; wait"}, "/",
                         started + std::chrono::milliseconds(500));
    REQUIRE_FALSE(late);
    CHECK(late.error().code == moat::errc::deadline_exceeded);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
    const pid_t child = std::stoi(read_file(pid_file));
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
        // The sleep was the killed shell's child: reparented and reaped by init, or a zombie.
        const std::string stat = read_file("/proc/" + std::to_string(child) + "/stat");
        gone = stat.empty() || stat.find(") Z ") != std::string::npos;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(gone);
}
