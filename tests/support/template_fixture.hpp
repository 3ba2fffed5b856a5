// What the template tests share: a scratch directory, a static busybox root, and a local backend
// on the scratch directory's data directory with a template store beside it.
#pragma once

#include "support/local_fixture.hpp"

#include <moat/templates.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moat::test {

namespace fs = std::filesystem;

// Debian's busybox-static (scripts/install-deps installs it).
inline constexpr const char* busybox = "/bin/busybox";

inline void write_text(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
}

// A scratch directory for one test: its source trees and its data directory.
struct scratch_dir {
    fs::path path;
    scratch_dir() {
        char name[] = "/tmp/moat-template-test-XXXXXX";
        path = ::mkdtemp(name);
    }
    ~scratch_dir() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

// A minimal root: static busybox as /bin/sh and a few applets, an /etc/motd, and /data, which
// everyone may write.
inline fs::path make_busybox_root(const fs::path& at) {
    fs::create_directories(at / "bin");
    fs::create_directories(at / "etc");
    fs::create_directories(at / "data");
    fs::permissions(at / "data", fs::perms::all);
    fs::copy_file(busybox, at / "bin/busybox");
    for (const char* applet : {"sh", "ls", "cat", "id", "echo", "touch", "stat", "dd", "mkdir",
                               "rm", "readlink", "head", "true"}) {
        fs::create_symlink("busybox", at / "bin" / applet);
    }
    write_text(at / "etc/motd", "from the template\n");
    fs::create_directories(at / "usr/lib");
    write_text(at / "usr/lib/data", "template data\n");
    return at;
}

struct template_fixture : moat::test::local_fixture {
    scratch_dir scratch;
    moat::template_store store{(scratch.path / "data").string()};

    template_fixture() {
        REQUIRE_MESSAGE(::access(busybox, X_OK) == 0,
                        "these tests need Debian's busybox-static (scripts/install-deps)");
        // The fixture's backend, on this test's data directory.
        local.reset();
        moat::local_options options;
        options.data_dir = store.data_dir();
        local = moat::make_local_backend(io.get_executor(), options);
    }

    moat::template_info build(const std::string& name, const fs::path& root) {
        auto built = store.build_from_dir(name, root.string());
        REQUIRE_MESSAGE(built, built.error().to_string());
        return built->built;
    }

    moat::sandbox_info create_from(const std::string& name) {
        moat::sandbox_spec spec;
        spec.template_name = name;
        return create(spec);
    }
};

}  // namespace moat::test
