// The pure parts of moat serve's files and filesystem services (src/serve/envd_entry.*,
// src/serve/file_signature.*), and the in-sandbox commands behind Stat, ListDir, MakeDir, Move and
// Remove run in real sandboxes with hostile file names and symlinks that point at host paths.
#include "serve/envd_entry.hpp"
#include "serve/file_signature.hpp"

#include "core/json_writer.hpp"
#include "support/local_fixture.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>

using moat::test::local_fixture;
namespace serve = moat::serve;

namespace {

moat::exec_result run_argv(local_fixture& f, const std::string& id, std::vector<std::string> argv) {
    moat::exec_request request;
    request.argv = std::move(argv);
    request.wall_limit = std::chrono::seconds(30);
    auto r = f.run(f.local->async_exec(id, std::move(request)));
    if (!r) FAIL("exec failed: " << r.error().to_string());
    return std::move(*r);
}

std::vector<serve::entry_info> entries_of(const moat::exec_result& r) {
    REQUIRE_MESSAGE(r.exit_code == 0, r.err.text());
    auto parsed = serve::parse_find_output(r.out.text());
    REQUIRE_MESSAGE(parsed.has_value(), parsed.error().to_string());
    return std::move(*parsed);
}

std::string read_host(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

TEST_CASE("envd paths resolve against the home, cleanly, and refuse another user's home") {
    const std::string home = "/home/user";
    CHECK(*serve::resolve_envd_path("", home) == "/home/user");
    CHECK(*serve::resolve_envd_path("~", home) == "/home/user");
    CHECK(*serve::resolve_envd_path("~/a/./b/", home) == "/home/user/a/b");
    CHECK(*serve::resolve_envd_path("file.txt", home) == "/home/user/file.txt");
    CHECK(*serve::resolve_envd_path("../../../etc//passwd", home) == "/etc/passwd");
    CHECK(*serve::resolve_envd_path("/a/../../b", home) == "/b");
    CHECK(*serve::resolve_envd_path("/", home) == "/");
    CHECK(serve::resolve_envd_path("~root/x", home).error().code == moat::errc::invalid_argument);
    CHECK(serve::resolve_envd_path(std::string("a\0b", 3), home).error().code ==
          moat::errc::invalid_argument);
    CHECK(!serve::resolve_envd_path("/" + std::string(5000, 'a'), home));
    CHECK(serve::parent_path("/a/b") == "/a");
    CHECK(serve::parent_path("/a") == "/");
    CHECK(serve::base_name("/a/b") == "b");
    CHECK(serve::base_name("/") == "/");
}

TEST_CASE("permissions read as Go's FileMode strings") {
    CHECK(serve::go_permissions('d', 0755) == "drwxr-xr-x");
    CHECK(serve::go_permissions('f', 0644) == "-rw-r--r--");
    CHECK(serve::go_permissions('l', 0777) == "Lrwxrwxrwx");
    CHECK(serve::go_permissions('f', 04755) == "urwxr-xr-x");
    CHECK(serve::go_permissions('d', 01777) == "dtrwxrwxrwx");
    CHECK(serve::go_permissions('c', 0666) == "Dcrw-rw-rw-");
    CHECK(serve::go_permissions('p', 0600) == "prw-------");
}

TEST_CASE("find output parses into entries, and a torn or malformed listing is refused") {
    // find -printf's output: every field followed by a NUL.
    auto fields = [](std::vector<std::string> f) {
        std::string out;
        for (auto& x : f) out += x + '\0';
        return out;
    };
    const auto out = fields({"f", "f", "5", "644", "user", "user", "1700000000.1234567890", "",
                             "/home/user/a b"}) +
                     fields({"l", "N", "4", "777", "1000", "1000", "1700000001.0000000000", "../x",
                             "/home/user/d/l"});
    auto parsed = serve::parse_find_output(out);
    REQUIRE(parsed.has_value());
    REQUIRE(parsed->size() == 2);
    const auto& a = (*parsed)[0];
    CHECK(a.name == "a b");
    CHECK(a.type == serve::entry_type::file);
    CHECK(a.size == 5);
    CHECK(a.mode == 0644);
    CHECK(a.permissions == "-rw-r--r--");
    CHECK(a.owner == "user");
    CHECK(a.modified_seconds == 1700000000);
    CHECK(a.modified_nanos == 123456789);
    CHECK(!a.symlink_target);
    const auto& l = (*parsed)[1];
    CHECK(l.type == serve::entry_type::unspecified);  // dangling: as envd, no type
    CHECK(l.permissions == "Lrwxrwxrwx");
    CHECK(*l.symlink_target == "/home/user/x");

    moat::json_writer w;
    moat::e2b_protocol::write_entry_info(w, a);
    CHECK(w.str() ==
          R"({"name":"a b","type":"FILE_TYPE_FILE","path":"/home/user/a b","size":"5","mode":420,)"
          R"("permissions":"-rw-r--r--","owner":"user","group":"user",)"
          R"("modifiedTime":"2023-11-14T22:13:20.123456789Z"})");

    CHECK(!serve::parse_find_output(out.substr(0, out.size() - 1)));
    CHECK(!serve::parse_find_output(fields({"f", "f", "x", "644", "u", "g", "1", "", "/a"})));
    CHECK(!serve::parse_find_output(fields({"f", "f", "1", "999", "u", "g", "1", "", "/a"})));
    CHECK(!serve::parse_find_output(fields({"f", "f", "1", "644", "u", "g", "1", "", "rel"})));
    CHECK(!serve::parse_find_output(fields({"ff", "f", "1", "644", "u", "g", "1", "", "/a"})));
    CHECK(serve::parse_find_output(fields({"f", "f", "1", "644", "u", "g", "1", "", "/a"})));
    CHECK(serve::parse_find_output("")->empty());
}

TEST_CASE("a listing is ordered as envd's walk orders it: depth first, names bytewise") {
    std::vector<serve::entry_info> entries;
    for (const char* path : {"/h/t/subdir2/b", "/h/t/subdir1-x", "/h/t/file1.txt", "/h/t/subdir1",
                             "/h/t/subdir2", "/h/t/subdir1/b", "/h/t/subdir1/a", "/h/t/B"}) {
        serve::entry_info e;
        e.path = path;
        entries.push_back(e);
    }
    serve::sort_as_walked(entries);
    std::vector<std::string> order;
    for (const auto& e : entries) order.push_back(e.path);
    CHECK(order == std::vector<std::string>{"/h/t/B", "/h/t/file1.txt", "/h/t/subdir1",
                                            "/h/t/subdir1/a", "/h/t/subdir1/b", "/h/t/subdir1-x",
                                            "/h/t/subdir2", "/h/t/subdir2/b"});
}

TEST_CASE("file URL signatures match the SDK's and expire") {
    // Computed as the SDK does (sha256 base64 without padding, "v1_" prefix).
    CHECK(serve::file_signature("/home/user/a.txt", serve::file_operation::read, "", "tok",
                                std::nullopt) == "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY");
    CHECK(serve::file_signature("rel.txt", serve::file_operation::write, "user", "tok",
                                1700000000) == "v1_OtACMckrp/fqWOZTa6G6KS0qKw5Gy+inA+5CMOGmVro");
    const auto sig = serve::file_signature("p", serve::file_operation::read, "", "tok", 100);
    using check = serve::signature_check;
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::read, "", "tok", "100",
                                      99) == check::valid);
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::read, "", "tok", "100",
                                      101) == check::expired);
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::write, "", "tok", "100",
                                      99) == check::mismatch);
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::read, "", "other", "100",
                                      99) == check::mismatch);
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::read, "", "tok",
                                      std::nullopt, 99) == check::mismatch);
    CHECK(serve::check_file_signature(sig, "p", serve::file_operation::read, "", "tok", "1e2",
                                      99) == check::mismatch);
    CHECK(serve::check_file_signature("", "p", serve::file_operation::read, "", "tok", "100", 99) ==
          check::mismatch);
}

TEST_CASE(
    "signed requests that name no sandbox cost a bounded number of token checks, and only "
    "well-formed signatures cost any") {
    const auto sig = serve::file_signature("p", serve::file_operation::read, "", "tok", 100);
    CHECK(serve::is_well_formed_signature(sig));
    CHECK_FALSE(serve::is_well_formed_signature(""));
    CHECK_FALSE(serve::is_well_formed_signature("v1_forged"));
    CHECK_FALSE(serve::is_well_formed_signature("v2_" + sig.substr(3)));
    CHECK_FALSE(serve::is_well_formed_signature(sig.substr(0, 45) + "!"));
    // 1000 checks a second, a second's worth saved: 1000 sandboxes' tokens once, then nothing
    // until the bucket refills.
    using clock = serve::signature_scan_budget::clock;
    const auto t0 = clock::now();
    serve::signature_scan_budget budget(1000, t0);
    CHECK(budget.take(1000, t0));
    CHECK_FALSE(budget.take(1, t0));
    CHECK_FALSE(budget.take(1000, t0 + std::chrono::milliseconds(500)));
    CHECK(budget.take(500, t0 + std::chrono::milliseconds(500)));
    // Idle for an hour saves no more than one second's worth.
    const auto later = t0 + std::chrono::hours(1);
    CHECK_FALSE(budget.take(1001, later));
    CHECK(budget.take(1000, later));
    CHECK(budget.should_warn(later));
    CHECK_FALSE(budget.should_warn(later + std::chrono::seconds(10)));
    CHECK(budget.should_warn(later + std::chrono::minutes(2)));
}

TEST_CASE_FIXTURE(local_fixture, "the filesystem commands handle hostile names inside a sandbox") {
    MOAT_REQUIRE_NAMESPACES();
    const auto id = create().id;
    const std::string dir = "/workspace/d";
    // Names with a newline, quotes, a leading dash, shell syntax and spaces.
    const std::vector<std::string> names = {"-rf", "a\nb", "q\"'`$(touch pwned)`$(touch ..\\pwned)",
                                            " s p "};
    auto made = entries_of(run_argv(*this, id, serve::make_dir_command(dir + "/sub/deeper")));
    REQUIRE(made.size() == 1);
    CHECK(made[0].path == dir + "/sub/deeper");
    CHECK(made[0].type == serve::entry_type::directory);
    CHECK(run_argv(*this, id, serve::make_dir_command(dir + "/sub")).exit_code ==
          serve::exit_already_exists);
    for (const auto& n : names) {
        auto moved = entries_of(run_argv(*this, id, serve::make_dir_command(dir + "/" + n)));
        REQUIRE(moved.size() == 1);
        CHECK(moved[0].name == n);
    }
    auto listed = entries_of(run_argv(*this, id, serve::list_command(dir, 1)));
    CHECK(listed.size() == names.size() + 1);
    auto deep = entries_of(run_argv(*this, id, serve::list_command(dir, 2)));
    CHECK(deep.size() == names.size() + 2);
    for (const auto& e : listed) CHECK(e.path == dir + "/" + e.name);

    auto moved =
        entries_of(run_argv(*this, id, serve::move_command(dir + "/a\nb", dir + "/new/x y")));
    REQUIRE(moved.size() == 1);
    CHECK(moved[0].path == dir + "/new/x y");
    CHECK(run_argv(*this, id, serve::move_command(dir + "/missing", dir + "/z")).exit_code ==
          serve::exit_not_found);
    CHECK(run_argv(*this, id, serve::stat_command(dir + "/missing")).exit_code ==
          serve::exit_not_found);
    CHECK(run_argv(*this, id, serve::list_command(dir + "/missing", 1)).exit_code ==
          serve::exit_not_found);
    CHECK(run_argv(*this, id, serve::remove_command(dir + "/-rf")).exit_code == 0);
    CHECK(run_argv(*this, id, serve::remove_command(dir + "/missing")).exit_code == 0);
    CHECK(run_argv(*this, id, serve::stat_command(dir + "/-rf")).exit_code ==
          serve::exit_not_found);
    CHECK(run_argv(*this, id, serve::stat_command(dir)).exit_code == 0);
    // Nothing a name says was ever run.
    CHECK(run_argv(*this, id, serve::stat_command("/workspace/pwned")).exit_code ==
          serve::exit_not_found);
    CHECK(run_argv(*this, id, serve::stat_command("/workspace/d/pwned")).exit_code ==
          serve::exit_not_found);

    // A file where a directory is asked for.
    CHECK(sh(id, "echo x > /workspace/file").exit_code == 0);
    CHECK(run_argv(*this, id, serve::make_dir_command("/workspace/file")).exit_code ==
          serve::exit_not_directory);
    CHECK(run_argv(*this, id, serve::list_command("/workspace/file", 1)).exit_code ==
          serve::exit_not_directory);
    auto file = entries_of(run_argv(*this, id, serve::stat_command("/workspace/file")));
    REQUIRE(file.size() == 1);
    CHECK(file[0].size == 2);
    CHECK(file[0].type == serve::entry_type::file);
    destroy(id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "filesystem commands through a symlink to a host path never touch the host") {
    MOAT_REQUIRE_NAMESPACES();
    char host_dir_template[] = "/tmp/moat-serve-host-XXXXXX";
    REQUIRE(::mkdtemp(host_dir_template) != nullptr);
    const std::string host_dir = host_dir_template;
    const std::string host_file = host_dir + "/secret";
    { std::ofstream(host_file) << "host secret"; }
    ::chmod(host_dir.c_str(), 0755);
    ::chmod(host_file.c_str(), 0666);

    const auto id = create().id;
    REQUIRE(
        sh(id, "ln -s " + host_dir + " /workspace/link && ln -s " + host_file + " /workspace/flink")
            .exit_code == 0);
    CHECK(run_argv(*this, id, serve::remove_command("/workspace/link/secret")).exit_code == 0);
    CHECK(run_argv(*this, id, serve::remove_command("/workspace/flink")).exit_code == 0);
    (void)run_argv(*this, id, serve::move_command("/workspace/link/secret", "/workspace/stolen"));
    (void)run_argv(*this, id, serve::make_dir_command("/workspace/link/made"));
    auto listed = run_argv(*this, id, serve::list_command("/workspace/link", 1));
    CHECK(listed.exit_code == serve::exit_not_found);  // the link dangles inside the sandbox
    CHECK(read_host(host_file) == "host secret");
    struct stat st {};
    CHECK(::stat((host_dir + "/made").c_str(), &st) != 0);
    destroy(id);
    ::unlink(host_file.c_str());
    ::rmdir(host_dir.c_str());
}
