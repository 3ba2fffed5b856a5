// Directory watches in a local sandbox (backend::async_watch_dir, sandbox::async_watch_dir): real
// inotify instances made by the sandbox's pid 1, real commands changing files. Events in order, a
// recursive watch that follows directories made later (a mkdir -p burst too), the bounded queue's
// overflow, the errors, the handle's cap, and the ends (the directory removed, the sandbox
// destroyed, the watch dropped).
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/with_timeout.hpp>

#include "support/async_wait.hpp"
#include "support/connect_retry.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <dirent.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

using moat::test::local_fixture;
using moat::test::optional_of;
using namespace std::chrono_literals;

namespace {

using moat::watch_event;
using moat::watch_event_type;
using moat::watch_item;

// "create f", "write d/" (a directory), "overflow 3", "end".
std::string text_of(const watch_item& item) {
    if (const auto* e = std::get_if<watch_event>(&item)) {
        return std::string(moat::to_string(e->type)) + " " + e->name + (e->is_dir ? "/" : "");
    }
    if (const auto* o = std::get_if<moat::watch_overflow>(&item)) {
        return "overflow " + std::to_string(o->lost);
    }
    return "end";
}

// Pulls until `count` items came, the end came, or nothing came for `quiet`.
asio::awaitable<std::vector<std::string>> pull(moat::dir_watch& w, std::size_t count,
                                               std::chrono::milliseconds quiet = 3s) {
    std::vector<std::string> out;
    while (out.size() < count) {
        auto next = w.async_next();
        const auto limit = moat::deadline::after(quiet);
        auto got = co_await moat::with_timeout(std::move(next), limit);
        if (!got) break;
        out.push_back(text_of(*got));
        if (std::holds_alternative<moat::watch_end>(*got)) break;
    }
    co_return out;
}

std::size_t open_descriptors() {
    std::size_t n = 0;
    DIR* dir = ::opendir("/proc/self/fd");
    while (dir != nullptr && ::readdir(dir) != nullptr) ++n;
    if (dir != nullptr) ::closedir(dir);
    return n;
}

// A handle to a new sandbox of `rt`; the test fails if there is none.
std::shared_ptr<moat::sandbox> new_handle(local_fixture& f, moat::runtime& rt) {
    auto created = f.run(rt.async_create({}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    return *created;
}

std::string joined(const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& line : lines) out += line + "\n";
    return out;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a watch reports create, write, rename, chmod and remove in order" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(sh(box.id, "mkdir /workspace/w").exit_code == 0);
    auto opened = *run(optional_of(local->async_watch_dir(box.id, "/workspace/w", {})));
    REQUIRE_MESSAGE(opened, opened.error().to_string());
    REQUIRE(sh(box.id,
               "cd /workspace/w && echo a > f && mv f g && chmod 600 g && mkdir d && rm g && "
               "rmdir d")
                .exit_code == 0);
    const auto events = run(pull(*opened, 8));
    const std::vector<std::string> expected = {"create f", "write f",   "rename f", "create g",
                                               "chmod g",  "create d/", "remove g", "remove d/"};
    CHECK_MESSAGE(events == expected, joined(events));

    // Removing the watched directory ends the watch.
    REQUIRE(sh(box.id, "rmdir /workspace/w").exit_code == 0);
    auto end = run(pull(*opened, 1));
    REQUIRE(end.size() == 1);
    CHECK(end[0] == "end");
    auto after = *run(optional_of(opened->async_next()));
    REQUIRE_FALSE(after);
    CHECK(after.error().code == moat::errc::invalid_argument);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a recursive watch follows directories made later, a mkdir -p burst whole" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(sh(box.id, "mkdir -p /workspace/r/old/inner").exit_code == 0);
    moat::watch_options options;
    options.recursive = true;
    auto opened = *run(optional_of(local->async_watch_dir(box.id, "/workspace/r", options)));
    REQUIRE_MESSAGE(opened, opened.error().to_string());

    // A directory that existed before the watch.
    REQUIRE(sh(box.id, "echo x > /workspace/r/old/inner/f").exit_code == 0);
    auto existing = run(pull(*opened, 2));
    const std::vector<std::string> in_existing = {"create old/inner/f", "write old/inner/f"};
    CHECK_MESSAGE(existing == in_existing, joined(existing));

    // Three levels at once and a file in the deepest: every one reported, each after its parent,
    // none twice.
    REQUIRE(sh(box.id, "cd /workspace/r && mkdir -p a/b/c && touch a/b/c/f").exit_code == 0);
    auto burst = run(pull(*opened, 100, 1500ms));
    std::vector<std::string> creates;
    for (const auto& line : burst) {
        if (line.starts_with("create ")) creates.push_back(line);
    }
    const std::vector<std::string> expected = {"create a/", "create a/b/", "create a/b/c/",
                                               "create a/b/c/f"};
    CHECK_MESSAGE(creates == expected, joined(burst));

    // The new directories are watched: a later write in the deepest is reported exactly.
    REQUIRE(sh(box.id, "echo y > /workspace/r/a/b/c/g").exit_code == 0);
    auto later = run(pull(*opened, 2));
    const std::vector<std::string> in_later = {"create a/b/c/g", "write a/b/c/g"};
    CHECK_MESSAGE(later == in_later, joined(later));

    // A directory moved within the watch keeps being watched under its new name.
    REQUIRE(sh(box.id, "cd /workspace/r && mv a z").exit_code == 0);
    auto moved = run(pull(*opened, 2));
    run(moat::test::pause(300ms));
    REQUIRE(sh(box.id, "echo w > /workspace/r/z/b/c/h").exit_code == 0);
    auto written = run(pull(*opened, 2));
    moved.insert(moved.end(), written.begin(), written.end());
    CHECK_MESSAGE(std::find(moved.begin(), moved.end(), "rename a/") != moved.end(), joined(moved));
    CHECK_MESSAGE(std::find(moved.begin(), moved.end(), "create z/") != moved.end(), joined(moved));
    CHECK_MESSAGE(std::find(moved.begin(), moved.end(), "write z/b/c/h") != moved.end(),
                  joined(moved));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a watch nobody pulls keeps its bound and reports one overflow, then goes on" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(sh(box.id, "mkdir /workspace/o").exit_code == 0);
    moat::watch_options options;
    options.max_queued_events = 4;
    auto opened = *run(optional_of(local->async_watch_dir(box.id, "/workspace/o", options)));
    REQUIRE_MESSAGE(opened, opened.error().to_string());
    // 50 files created and written: 100 events.
    REQUIRE(
        sh(box.id, "cd /workspace/o && for i in $(seq 1 50); do echo x > f$i; done").exit_code ==
        0);
    run(moat::test::pause(500ms));
    auto first = run(pull(*opened, 5));
    REQUIRE_MESSAGE(first.size() == 5, joined(first));
    CHECK(first[0] == "create f1");
    CHECK(first[3] == "write f2");
    CHECK(first[4] == "overflow 96");
    // Nothing else was kept; the watch goes on.
    REQUIRE(sh(box.id, "touch /workspace/o/after").exit_code == 0);
    auto next = run(pull(*opened, 1));
    REQUIRE(next.size() == 1);
    CHECK(next[0] == "create after");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "watching a missing directory, a file or a relative path fails as the file "
                  "calls do" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = new_handle(*this, rt);
    REQUIRE(run(box->async_exec(moat::test::shell("echo x > /workspace/file")))->exit_code == 0);

    auto missing = *run(optional_of(box->async_watch_dir("/workspace/missing")));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::file_not_found);
    CHECK(missing.error().detail.find("/workspace/missing") != std::string::npos);
    auto file = *run(optional_of(box->async_watch_dir("/workspace/file")));
    REQUIRE_FALSE(file);
    CHECK(file.error().code == moat::errc::invalid_path);
    CHECK(file.error().detail.find("not a directory") != std::string::npos);
    auto relative = *run(optional_of(box->async_watch_dir("workspace")));
    REQUIRE_FALSE(relative);
    CHECK(relative.error().code == moat::errc::invalid_path);
    // /root is the sandbox root user's, mode 0700 in the template: the sandbox user may not.
    auto listed = run(box->async_exec(moat::test::shell("ls /root >/dev/null 2>&1")));
    if (listed->exit_code != 0) {
        auto denied = *run(optional_of(box->async_watch_dir("/root")));
        REQUIRE_FALSE(denied);
        CHECK(denied.error().code == moat::errc::permission_denied);
    }
    CHECK_FALSE(box->quarantine_cause().has_value());
    CHECK(box->state() == moat::handle_state::ready);
    auto destroyed = run(box->async_destroy());
    CHECK(destroyed);
}

namespace {

asio::awaitable<void> pull_into(moat::dir_watch* w,
                                std::shared_ptr<std::optional<std::string>> out) {
    auto got = co_await w->async_next();
    if (got) {
        out->emplace(text_of(*got));
    } else {
        out->emplace(got.error().to_string());
    }
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a handle's watches use the side lane, are capped, close their descriptors and "
                  "end with the sandbox" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = new_handle(*this, rt);

    // A command holds the ordered lane: a watch opens and reports beside it.
    auto long_command = std::make_shared<std::optional<moat::result<moat::exec_result>>>();
    tasks.spawn(moat::test::exec_into(box, "sleep 3", long_command));
    run(moat::test::pause(200ms));
    auto watch = *run(optional_of(box->async_watch_dir("/tmp")));
    REQUIRE_MESSAGE(watch, watch.error().to_string());
    std::vector<moat::file_write> files(1);
    files[0].path = "/tmp/beside";
    files[0].content = "x";
    auto written = run(box->async_write_files(files, {}, moat::lane::side));
    REQUIRE(written);
    auto seen = run(pull(*watch, 2));
    CHECK_FALSE(long_command->has_value());  // all while the ordered lane was busy
    // The atomic write (a temporary file renamed over the target) shows as the target created
    // and written, as envd's in-place write would; the temporary file never shows.
    const std::vector<std::string> written_events = {"create beside", "write beside"};
    CHECK_MESSAGE(seen == written_events, joined(seen));

    // The cap: 64 open at once (this one counts), the 65th refused until one goes.
    const std::size_t descriptors_before = open_descriptors();
    std::vector<moat::dir_watch> more;
    for (int i = 0; i < 63; ++i) {
        auto another = *run(optional_of(box->async_watch_dir("/workspace")));
        REQUIRE_MESSAGE(another, another.error().to_string());
        more.push_back(std::move(*another));
    }
    auto refused = *run(optional_of(box->async_watch_dir("/workspace")));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::limit_exceeded);
    CHECK(refused.error().detail.find("max_watches") != std::string::npos);
    more.pop_back();
    auto again = *run(optional_of(box->async_watch_dir("/workspace")));
    REQUIRE_MESSAGE(again, again.error().to_string());
    more.push_back(std::move(*again));
    CHECK(open_descriptors() >= descriptors_before + 63);
    // Dropping them closes their instances: this process holds what it held before.
    more.clear();
    CHECK(open_descriptors() <= descriptors_before);

    // Destroying the sandbox ends a pull that waits.
    run(pull(*watch, 100, 300ms));
    auto pulled = std::make_shared<std::optional<std::string>>();
    tasks.spawn(pull_into(&*watch, pulled));
    run(moat::test::pause(100ms));
    CHECK_FALSE(pulled->has_value());
    auto destroyed = run(box->async_destroy());
    CHECK(destroyed);
    REQUIRE(run(moat::test::until([&] { return pulled->has_value(); }, 5s)));
    CHECK(**pulled == "end");
    CHECK_FALSE(box->quarantine_cause().has_value());
    run(moat::test::until([&] { return long_command->has_value(); }, 10s));
}
