// File metadata (files.hpp): the rules, and the local backend keeping it as user.e2b.* extended
// attributes. What a write leaves is checked from inside the sandbox (python3's os.listxattr on
// the file), never only through the API under test.
#include <moat/files.hpp>
#include <moat/runtime.hpp>

#include "support/local_fixture.hpp"
#include "support/text_source.hpp"

#include <memory>
#include <string>

using moat::errc;
using moat::file_metadata;
using moat::test::local_fixture;
using moat::test::text_source;

namespace {

moat::result<void> write_with(local_fixture& f, const std::string& id, const std::string& path,
                              std::string content, file_metadata metadata,
                              std::uint32_t mode = 0644) {
    moat::file_write_target target;
    target.path = path;
    target.mode = mode;
    target.metadata = std::move(metadata);
    auto r = f.run(f.local->async_write_file_stream(id, target, text_source(std::move(content))));
    if (!r) FAIL("write_file_stream failed whole: " << r.error().to_string());
    return r->outcome;
}

std::vector<moat::file_metadata_result> read_back(local_fixture& f, const std::string& id,
                                                  std::vector<std::string> paths) {
    const auto count = paths.size();
    auto r = f.run(f.local->async_read_metadata(id, std::move(paths)));
    REQUIRE_MESSAGE(r, r.error().to_string());
    REQUIRE(r->size() == count);
    return std::move(*r);
}

// Every extended attribute of `path` as the sandbox's own python3 sees it, "name=value" per line,
// sorted.
std::string xattrs_inside(local_fixture& f, const std::string& id, const std::string& path) {
    const auto ran = f.sh(id,
                          "python3 -I -S -c 'import os,sys; p=sys.argv[1]; "
                          "print(\"\\n\".join(sorted(n+\"=\"+os.getxattr(p,n).decode() "
                          "for n in os.listxattr(p))))' " +
                              path);
    CHECK_MESSAGE(ran.exit_code == 0, ran.err.text());
    return ran.out.text();
}

}  // namespace

TEST_CASE("file metadata rules: token keys lowercased, printable values, one block in all") {
    auto ok = moat::normalize_file_metadata({{"Author", "Ada Lovelace"}, {"k-1.x_y~", ""}});
    REQUIRE(ok);
    CHECK(*ok == file_metadata{{"author", "Ada Lovelace"}, {"k-1.x_y~", ""}});
    CHECK(moat::normalize_file_metadata({})->empty());

    const auto refused = [](file_metadata m) {
        auto r = moat::normalize_file_metadata(m);
        REQUIRE_FALSE(r);
        return r.error();
    };
    auto spaced = refused({{"a b", "x"}});
    CHECK(spaced.code == errc::invalid_argument);
    CHECK(spaced.detail.find("'a b'") != std::string::npos);
    CHECK(refused({{"", "x"}}).code == errc::invalid_argument);
    CHECK(refused({{"k\xc3\xa9", "x"}}).code == errc::invalid_argument);
    auto control = refused({{"k", "line\nbreak"}});
    CHECK(control.code == errc::invalid_argument);
    CHECK(control.detail == "the value of metadata key 'k' is not printable US-ASCII");
    CHECK(refused({{"k", "caf\xc3\xa9"}}).code == errc::invalid_argument);
    CHECK(refused({{"Key", "1"}, {"key", "2"}}).detail.find("given twice") != std::string::npos);
    CHECK(refused({{std::string(moat::max_file_metadata_key_bytes + 1, 'k'), ""}}).code ==
          errc::invalid_argument);
    CHECK(
        moat::normalize_file_metadata({{std::string(moat::max_file_metadata_key_bytes, 'k'), ""}}));
    // 4096 bytes in all, each key counted with "user.e2b.".
    const std::size_t room = moat::max_file_metadata_bytes - moat::file_metadata_prefix.size() - 1;
    CHECK(moat::normalize_file_metadata({{"k", std::string(room, 'v')}}));
    auto big = refused({{"k", std::string(room + 1, 'v')}});
    CHECK(big.code == errc::too_large);
    CHECK(big.detail.find("4097") != std::string::npos);
}

TEST_CASE_FIXTURE(local_fixture,
                  "file metadata is kept as user.e2b.* attributes, read back through a symlink, "
                  "and replaced by the next write") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(write_with(*this, box.id, "/workspace/a.txt", "hello",
                       {{"Author", "Ada"}, {"note", "a b&c=d"}}, 0444));
    CHECK(xattrs_inside(*this, box.id, "/workspace/a.txt") ==
          "user.e2b.author=Ada\nuser.e2b.note=a b&c=d\n");
    CHECK(sh(box.id, "cat /workspace/a.txt; stat -c ' %a %u' /workspace/a.txt").out.text() ==
          "hello 444 1000\n");
    CHECK(sh(box.id, "ln -s a.txt /workspace/link && mkdir /workspace/d").exit_code == 0);

    auto got = read_back(*this, box.id,
                         {"/workspace/a.txt", "/workspace/link", "/workspace/d",
                          "/workspace/missing", "relative/path"});
    const file_metadata expected{{"author", "Ada"}, {"note", "a b&c=d"}};
    REQUIRE(got[0].metadata);
    CHECK(*got[0].metadata == expected);
    REQUIRE(got[1].metadata);  // the link's target's
    CHECK(*got[1].metadata == expected);
    CHECK(got[1].path == "/workspace/link");
    REQUIRE(got[2].metadata);
    CHECK(got[2].metadata->empty());
    CHECK(got[3].metadata.error().code == errc::file_not_found);
    CHECK(got[3].metadata.error().detail.find("/workspace/missing") == 0);
    CHECK(got[4].metadata.error().code == errc::invalid_path);

    // A replacing write brings its own metadata, none here: nothing of the old is left.
    REQUIRE(write_with(*this, box.id, "/workspace/a.txt", "second", {}));
    CHECK(xattrs_inside(*this, box.id, "/workspace/a.txt") == "\n");  // print() of none
    REQUIRE(read_back(*this, box.id, {"/workspace/a.txt"})[0].metadata);
    CHECK(read_back(*this, box.id, {"/workspace/a.txt"})[0].metadata->empty());

    // Attributes set from inside that break the rules, or are outside the prefix, are left out.
    const auto set = sh(box.id,
                        "python3 -I -S -c 'import os; p=\"/workspace/a.txt\"; "
                        "os.setxattr(p,\"user.e2b.Upper\",b\"x\"); "
                        "os.setxattr(p,\"user.e2b.ctl\",b\"a\\nb\"); "
                        "os.setxattr(p,\"user.other\",b\"y\"); "
                        "os.setxattr(p,\"user.e2b.ok\",b\"fine\")'");
    REQUIRE_MESSAGE(set.exit_code == 0, set.err.text());
    got = read_back(*this, box.id, {"/workspace/a.txt"});
    REQUIRE(got[0].metadata);
    CHECK(*got[0].metadata == file_metadata{{"ok", "fine"}});

    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "file metadata through the sandbox handle") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto created = run(rt.async_create({}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    moat::file_write_target target;
    target.path = "/workspace/h.txt";
    target.metadata = {{"Tag", "handle"}};
    auto written = run(box->async_write_file_stream(target, text_source("x")));
    REQUIRE_MESSAGE(written, written.error().to_string());
    REQUIRE_MESSAGE(written->outcome, written->outcome.error().to_string());
    auto through = run(box->async_read_metadata({"/workspace/h.txt"}));
    REQUIRE_MESSAGE(through, through.error().to_string());
    REQUIRE(through->at(0).metadata);
    CHECK(*through->at(0).metadata == file_metadata{{"tag", "handle"}});
    CHECK(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "file metadata that breaks the rules fails the write and leaves the old file") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(write_with(*this, box.id, "/workspace/keep", "old", {{"v", "1"}}));
    auto bad = write_with(*this, box.id, "/workspace/keep", "new", {{"a b", "x"}});
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == errc::invalid_argument);
    CHECK(bad.error().detail.find("/workspace/keep: metadata key 'a b'") == 0);
    auto huge =
        write_with(*this, box.id, "/workspace/keep", "new", {{"k", std::string(5000, 'v')}});
    REQUIRE_FALSE(huge);
    CHECK(huge.error().code == errc::too_large);
    CHECK(sh(box.id, "cat /workspace/keep; ls -A /workspace").out.text() == "oldkeep\n");
    CHECK(xattrs_inside(*this, box.id, "/workspace/keep") == "user.e2b.v=1\n");

    // More paths than a batch takes fails the whole call.
    std::vector<std::string> many(moat::file_limits{}.max_files + 1, "/workspace/keep");
    auto refused = run(local->async_read_metadata(box.id, many));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == errc::too_large);
    destroy(box.id);
}
