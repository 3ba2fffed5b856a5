// The sandbox layout (sandbox_spec::layout) on the real local backend: a custom user, home,
// working directory and artifacts directory, as `moat serve` asks for them; the tool layer and its
// definitions on such a sandbox; bad fields refused; the default unchanged.
#include <doctest/doctest.h>

#include <moat/backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "local/sandbox_records.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <algorithm>
#include <string>
#include <vector>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// What moat serve asks for.
moat::sandbox_layout serve_layout() {
    moat::sandbox_layout layout;
    layout.user = "user";
    layout.home = "/home/user";
    layout.workdir = "/home/user";
    layout.artifacts_dir = "/home/user/out";
    return layout;
}

// Another name than the template's, so that the sandbox's own /etc/passwd is what answers.
moat::sandbox_layout named_layout() {
    moat::sandbox_layout layout = serve_layout();
    layout.user = "agent";
    layout.home = "/home/agent";
    layout.workdir = "/home/agent/work";
    layout.artifacts_dir = "/tmp/results/out";
    return layout;
}

moat::sandbox_spec spec_with(const moat::sandbox_layout& layout) {
    moat::sandbox_spec spec;
    spec.layout = layout;
    spec.labels["test"] = "layout";
    return spec;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a custom layout runs commands as its user in its home, which persists" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create(spec_with(serve_layout()));
    CHECK(box.layout == serve_layout());
    CHECK(sh(box.id, "pwd").out.text() == "/home/user\n");
    CHECK(sh(box.id, "echo $HOME").out.text() == "/home/user\n");
    CHECK(sh(box.id, "id -un").out.text() == "user\n");
    CHECK(sh(box.id, "id -gn").out.text() == "user\n");
    CHECK(sh(box.id, "id -u").out.text() == "1000\n");
    CHECK(sh(box.id, "python3 -c 'import os, pwd; print(pwd.getpwuid(os.getuid()).pw_dir)'")
              .out.text() == "/home/user\n");
    // Created at create time, owned by the user; the artifacts directory too.
    CHECK(sh(box.id, "stat -c '%u:%g %a' /home/user /home/user/out").out.text() ==
          "1000:1000 755\n1000:1000 755\n");
    // Persistent across commands, and a file a command creates is the user's.
    CHECK(sh(box.id, "echo kept > ~/notes.txt && mkdir -p ~/src").exit_code == 0);
    CHECK(sh(box.id, "cat /home/user/notes.txt; stat -c '%U %u' notes.txt src").out.text() ==
          "kept\nuser 1000\nuser 1000\n");
    // A file written through the file API is the user's too, and the command reads it.
    std::vector<moat::file_write> files{{"/home/user/src/from-host.txt", "through the API", 0644}};
    auto written = run(local->async_write_files(box.id, files));
    REQUIRE(written);
    REQUIRE(written->front().outcome);
    CHECK(sh(box.id, "stat -c '%U %u' src/from-host.txt; cat src/from-host.txt").out.text() ==
          "user 1000\nthrough the API");
    // /home is a tmpfs of /workspace's size (charged to the same memory cgroup); /etc stays
    // read-only, its passwd included.
    CHECK(sh(box.id,
             "test \"$(stat -f -c %b /home)\" = \"$(stat -f -c %b /workspace)\" && "
             "stat -f -c %T /home")
              .out.text() == "tmpfs\n");
    CHECK(sh(box.id, "echo 'x::0:0::/:/bin/sh' >> /etc/passwd").exit_code != 0);
    // /workspace is still there, empty, and writable.
    CHECK(sh(box.id, "ls -A /workspace; touch /workspace/w && echo ok").out.text() == "ok\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a layout's user name and home are the sandbox's own in /etc/passwd and "
                  "/etc/group, and its directories are made under /tmp and /home" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create(spec_with(named_layout()));
    CHECK(box.layout == named_layout());
    CHECK(sh(box.id, "id -un; id -gn; id -u; pwd; echo $HOME").out.text() ==
          "agent\nagent\n1000\n/home/agent/work\n/home/agent\n");
    CHECK(sh(box.id, "grep -c '^user:' /etc/passwd /etc/group; grep '^agent:' /etc/passwd")
              .out.text() ==
          "/etc/passwd:0\n/etc/group:0\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n");
    CHECK(
        sh(box.id, "stat -c '%n %U' /home/agent /home/agent/work /tmp/results /tmp/results/out")
            .out.text() ==
        "/home/agent agent\n/home/agent/work agent\n/tmp/results agent\n/tmp/results/out agent\n");
    // A file created in /tmp: the same uid.
    CHECK(sh(box.id, "touch /tmp/results/out/r && stat -c %u /tmp/results/out/r").out.text() ==
          "1000\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "the default layout is unchanged") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    CHECK(box.layout.user == "user");  // the effective name of the sandbox user
    CHECK(box.layout.home == "/workspace");
    CHECK(box.layout.workdir == "/workspace");
    CHECK(box.layout.artifacts_dir == "/workspace/out");
    CHECK(sh(box.id, "pwd; echo $HOME; id -un; id -u; ls -A /workspace; ls -A /home").out.text() ==
          "/workspace\n/workspace\nuser\n1000\n");
    CHECK(sh(box.id, "grep '^user:' /etc/passwd").out.text() ==
          "user:x:1000:1000:user:/workspace:/bin/sh\n");
    // No tmpfs on /home: the template's read-only, empty mount point.
    const auto home = sh(box.id, "grep -c ' /home ' /proc/mounts; touch /home/x 2>/dev/null");
    CHECK(home.out.text() == "0\n");
    CHECK(home.exit_code != 0);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "bad layout fields fail the create with invalid_argument naming "
                  "the field" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    struct bad_case {
        const char* field;
        moat::sandbox_layout layout;
    };
    std::vector<bad_case> cases;
    const auto with = [&cases](const char* field, auto change) {
        moat::sandbox_layout layout = serve_layout();
        change(layout);
        cases.push_back({field, std::move(layout)});
    };
    with("layout.user", [](auto& l) { l.user = "Bad User"; });
    with("layout.user", [](auto& l) { l.user = "1user"; });
    with("layout.user", [](auto& l) { l.user = "us:er"; });
    with("layout.user", [](auto& l) { l.user = std::string(33, 'a'); });
    with("layout.user", [](auto& l) { l.user = "root"; });
    with("layout.home", [](auto& l) { l.home = "home/user"; });
    with("layout.home", [](auto& l) { l.home = "/home/../etc"; });
    with("layout.home", [](auto& l) { l.home = "/home/user/"; });
    with("layout.home", [](auto& l) { l.home = "/home//user"; });
    with("layout.home", [](auto& l) { l.home = "/home/./user"; });
    with("layout.home", [](auto& l) { l.home = "/etc/user"; });
    with("layout.home", [](auto& l) { l.home = "/home"; });
    with("layout.home", [](auto& l) { l.home = "/workspace/home"; });
    with("layout.home", [](auto& l) { l.home = "/home/us\ner"; });
    with("layout.home", [](auto& l) { l.home = "/home/" + std::string(300, 'a'); });
    with("layout.workdir", [](auto& l) { l.workdir = ""; });
    with("layout.workdir", [](auto& l) { l.workdir = "/home/user/../.."; });
    with("layout.artifacts_dir", [](auto& l) { l.artifacts_dir = "out"; });
    with("layout.artifacts_dir", [](auto& l) { l.artifacts_dir = "/usr/out"; });
    with("layout.artifacts_dir", [](auto& l) { l.artifacts_dir = "/home"; });
    for (const auto& c : cases) {
        auto made = run(local->async_create(spec_with(c.layout)));
        REQUIRE_FALSE_MESSAGE(made, c.field);
        CHECK(made.error().code == moat::errc::invalid_argument);
        CHECK_MESSAGE(made.error().detail.starts_with(c.field), made.error().detail);
    }
    auto listed = run(local->async_list({{"test", "layout"}}));
    REQUIRE(listed);
    CHECK(listed->empty());
}

TEST_CASE("the layout is kept in the record: another backend lists, attaches and inspects it" *
          moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    auto spec = spec_with(serve_layout());
    spec.survive_owner = true;
    spec.ttl = 10min;
    const auto box = creator.create(spec);
    creator.shut_down();

    local_fixture other;
    auto listed = other.run(other.local->async_list({{"test", "layout"}}));
    REQUIRE(listed);
    const auto it = std::find_if(listed->begin(), listed->end(),
                                 [&](const moat::sandbox_info& i) { return i.id == box.id; });
    REQUIRE(it != listed->end());
    CHECK(it->layout == serve_layout());
    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE(attached);
    CHECK(attached->layout == serve_layout());
    auto inspected = other.run(other.local->async_inspect(box.id));
    REQUIRE(inspected);
    CHECK(inspected->layout == serve_layout());
    // The attached backend runs commands with the recorded layout: cwd and HOME.
    CHECK(other.sh(box.id, "pwd; echo $HOME").out.text() == "/home/user\n/home/user\n");
    other.destroy(box.id);
}

TEST_CASE("tool definitions describe the layout they are made for") {
    const auto custom = moat::tool_definitions(serve_layout());
    const auto defaults = moat::tool_definitions();
    REQUIRE(custom.size() == defaults.size());
    bool says_workdir = false;
    bool says_artifacts = false;
    for (const auto& d : custom) {
        CHECK_MESSAGE(d.description.find("/workspace") == std::string::npos, d.name);
        CHECK_MESSAGE(d.input_schema.find("/workspace") == std::string::npos, d.name);
        says_workdir |=
            d.description.find("in /home/user (your working directory)") != std::string::npos;
        says_artifacts |= d.description.find("under /home/user/out") != std::string::npos;
    }
    CHECK(says_workdir);
    CHECK(says_artifacts);
    // A home apart from the working directory is named; the default names /workspace.
    auto apart = serve_layout();
    apart.workdir = "/home/user/project";
    const auto named = moat::tool_definitions(apart, "moat_");
    CHECK(named[0].name == "moat_run_python");
    CHECK(named[0].description.find("Your home directory ($HOME) is /home/user.") !=
          std::string::npos);
    CHECK(named[4].input_schema.find("(default /home/user/project)") != std::string::npos);
    CHECK(defaults[0].description.find("files stay in /workspace") != std::string::npos);
    CHECK(defaults[0].description.find("under /workspace/out") != std::string::npos);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a tool session on a custom layout works in its working directory and lists "
                  "artifacts from its artifacts directory" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    moat::manager_options options;
    options.spec = spec_with(serve_layout());
    moat::session_manager manager(rt, options);
    moat::tool_session tools(manager, "custom-layout");
    CHECK(tools.layout() == serve_layout());
    const auto definitions = tools.definitions();
    REQUIRE_FALSE(definitions.empty());
    CHECK(definitions[0].description.find("/home/user/out") != std::string::npos);

    auto shell = run(tools.async_run_shell("pwd; echo $HOME; id -un"));
    REQUIRE(shell);
    CHECK(shell->stdout_text == "/home/user\n/home/user\nuser\n");
    // Python cells run (and are saved) in the working directory.
    auto cell = run(tools.async_run_python(
        "import os\nprint(os.getcwd())\nopen('out/plot.txt', 'w').write('chart')\n"
        "_ = open('/home/user/out/.hidden', 'w').write('no')"));
    REQUIRE(cell);
    CHECK(cell->status == moat::tool_status::ok);
    CHECK(cell->stdout_text == "/home/user\n");
    REQUIRE(cell->artifacts.size() == 1);
    CHECK(cell->artifacts[0].path == "plot.txt");
    auto failing = run(tools.async_run_python("1/0"));
    REQUIRE(failing);
    CHECK(failing->error_type == "ZeroDivisionError");
    CHECK(failing->traceback.find("/home/user/.cells/") != std::string::npos);

    // Relative paths start at the working directory; list_files defaults to it.
    auto wrote = run(tools.async_call("write_file", R"({"path":"data/a.csv","content":"a,b\n"})"));
    REQUIRE(wrote);
    CHECK(wrote->path == "/home/user/data/a.csv");
    auto read = run(tools.async_call("read_file", R"({"path":"data/a.csv"})"));
    REQUIRE(read);
    CHECK(read->content == "a,b\n");
    auto listed = run(tools.async_call("list_files", "{}"));
    REQUIRE(listed);
    CHECK(listed->path == "/home/user");
    const auto has = [&](const char* name) {
        return std::any_of(listed->entries.begin(), listed->entries.end(),
                           [&](const moat::dir_entry& e) { return e.name == name; });
    };
    CHECK(has("data"));
    CHECK(has("out"));
    auto missing = run(tools.async_call("read_file", R"({"path":"none.txt"})"));
    REQUIRE(missing);
    CHECK(missing->hint.find("relative paths start at /home/user") != std::string::npos);

    auto artifacts = run(tools.async_list_artifacts());
    REQUIRE(artifacts);
    REQUIRE(artifacts->size() == 1);
    CHECK((*artifacts)[0].path == "plot.txt");
    auto bytes = run(tools.async_read_artifact("plot.txt"));
    REQUIRE(bytes);
    CHECK(*bytes == "chart");
    auto escape = run(tools.async_read_artifact("../data/a.csv"));
    REQUIRE_FALSE(escape);
    CHECK(escape.error().code == moat::errc::invalid_path);
    auto workspace_file = run(tools.async_read_workspace_file("data/a.csv"));
    REQUIRE(workspace_file);
    CHECK(*workspace_file == "a,b\n");

    auto started = run(tools.async_start_process("pwd; sleep 0"));
    REQUIRE(started);
    REQUIRE(started->processes.size() == 1);
    CHECK(started->processes[0].cwd == "/home/user");
    REQUIRE(run(tools.async_end()));
    (void)run(manager.async_shutdown());
}

TEST_CASE("a record keeps the layout, and one written before the layout reads as the default") {
    moat::sandbox_record r;
    r.id = "sb-0123456789abcdef0123";
    r.owner_instance = "host/1/abc";
    r.layout = named_layout();
    const std::string json = moat::to_json(r);
    auto back = moat::record_from_json(json);
    REQUIRE(back);
    CHECK(back->layout == named_layout());

    // Before the layout, a record had only "workdir".
    std::string old = json;
    for (const char* key : {"user", "home", "artifacts_dir"}) {
        const auto at = old.find(std::string("\"") + key + "\":");
        REQUIRE(at != std::string::npos);
        old.erase(at, old.find(',', at) + 1 - at);
    }
    CHECK(old.find("\"home\"") == std::string::npos);
    back = moat::record_from_json(old);
    REQUIRE(back);
    CHECK(back->layout.workdir == "/home/agent/work");
    CHECK(back->layout.home == "/workspace");
    CHECK(back->layout.artifacts_dir == "/workspace/out");
    CHECK(back->layout.user.empty());

    std::string wrong = json;
    wrong.replace(wrong.find("\"home\":\"/home/agent\""), 20, "\"home\":17");
    auto refused = moat::record_from_json(wrong);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().detail.find("home") != std::string::npos);
}
