// The interpreter's contexts and per-cell environment, through python_kernel on a real sandbox:
// what an E2B Code Interpreter server maps its /contexts and env_vars onto.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>

#include "support/local_fixture.hpp"
#include "tools/python_kernel.hpp"

#include <algorithm>
#include <memory>
#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

struct kernel_fixture : local_fixture {
    kernel_fixture() : rt(*local), kernel("python3", moat::output_limits{65536, 65536}) {
        moat::sandbox_spec spec;
        spec.labels["test"] = "python-contexts";
        auto created = run(rt.async_create(spec));
        REQUIRE(created);
        box = std::move(*created);
    }
    ~kernel_fixture() { (void)run(box->async_destroy()); }

    moat::cell_outcome cell(const std::string& code, moat::cell_options options = {}) {
        auto ran = run(kernel.async_run(box, code, 20s, {}, {}, {}, std::move(options)));
        INFO((ran ? std::string() : ran.error().to_string()));
        REQUIRE(ran);
        return std::move(*ran);
    }

    moat::python_context context(const std::string& language, const std::string& cwd) {
        auto made = run(kernel.async_create_context(box, language, cwd));
        INFO((made ? std::string() : made.error().to_string()));
        REQUIRE(made);
        return std::move(*made);
    }

    // The main result's text, or the error's name.
    std::string shown(const std::string& code, const std::string& context = {}) {
        moat::cell_options options;
        options.context = context;
        const auto outcome = cell(code, options);
        if (const auto* error = outcome.cell.error()) return error->name;
        const auto* main = outcome.cell.main_result();
        return main == nullptr ? outcome.out.text() : std::string(main->text());
    }

    moat::runtime rt;
    moat::python_kernel kernel;
    std::shared_ptr<moat::sandbox> box;
};

}  // namespace

TEST_CASE_FIXTURE(kernel_fixture,
                  "a cell's environment variables reach it and its ! lines, and do not leak into "
                  "the next cell") {
    MOAT_REQUIRE_NAMESPACES();
    cell("import os\nos.environ['KEPT'] = 'before'");
    moat::cell_options options;
    options.env = {{"GREETING", "hello"}, {"KEPT", "during"}};
    const auto with = cell(
        "print(os.environ['GREETING'], os.environ['KEPT'])\n!echo $GREETING from a shell", options);
    CHECK(with.out.text() == "hello during\nhello from a shell\n");
    CHECK(shown("print(os.environ.get('GREETING'))") == "None\n");
    CHECK(shown("os.environ['KEPT']") == "'before'");
}

TEST_CASE_FIXTURE(kernel_fixture,
                  "contexts keep their own namespace and working directory, restart empties one "
                  "and remove ends it") {
    MOAT_REQUIRE_NAMESPACES();
    const auto in_tmp = context("python", "/tmp");
    const auto other = context("", "");
    CHECK(other.language == "python");
    CHECK(in_tmp.id != other.id);

    CHECK(shown("x = 'default'\nx") == "'default'");
    CHECK(shown("x = 'tmp'\nimport os\nos.getcwd()", in_tmp.id) == "'/tmp'");
    CHECK(shown("import os\nos.getcwd()", other.id) == "'/workspace'");
    CHECK(shown("x", other.id) == "NameError");
    CHECK(shown("x = 'other'\nx", other.id) == "'other'");
    CHECK(shown("x", in_tmp.id) == "'tmp'");
    CHECK(shown("x") == "'default'");

    auto listed = run(kernel.async_list_contexts(box));
    REQUIRE(listed);
    CHECK(listed->size() == 3);
    const auto found = std::find_if(listed->begin(), listed->end(),
                                    [&](const auto& c) { return c.id == in_tmp.id; });
    REQUIRE(found != listed->end());
    CHECK(found->cwd == "/tmp");

    REQUIRE(run(kernel.async_restart_context(box, in_tmp.id)));
    CHECK(shown("x", in_tmp.id) == "NameError");
    CHECK(shown("import os\nos.getcwd()", in_tmp.id) == "'/tmp'");
    CHECK(shown("x", other.id) == "'other'");

    REQUIRE(run(kernel.async_remove_context(box, other.id)));
    auto gone =
        run(kernel.async_run(box, "1", 10s, {}, {}, {}, moat::cell_options{other.id, {}, {}}));
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == moat::errc::invalid_argument);
    CHECK(run(kernel.async_list_contexts(box))->size() == 2);
    CHECK(shown("x") == "'default'");

    auto missing = run(kernel.async_create_context(box, "python", "/no/such/dir"));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::invalid_argument);
    auto unknown = run(kernel.async_create_context(box, "cobol", ""));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == moat::errc::not_supported);
    auto no_such = run(kernel.async_restart_context(box, "feedbeef"));
    REQUIRE_FALSE(no_such);
    CHECK(no_such.error().code == moat::errc::invalid_argument);
}

TEST_CASE_FIXTURE(kernel_fixture,
                  "a bash context keeps its working directory and exports, scopes a cell's "
                  "variables, and keeps its state through an interrupt") {
    MOAT_REQUIRE_NAMESPACES();
    moat::cell_options in_shell;
    in_shell.context = context("bash", "/tmp").id;
    CHECK(cell("pwd\ncd /workspace\nexport KEPT=yes\nLOCAL=also", in_shell).out.text() == "/tmp\n");
    CHECK(cell("echo $PWD $KEPT $LOCAL", in_shell).out.text() == "/workspace yes also\n");
    auto failed = cell("echo partial\nfalse", in_shell);
    REQUIRE(failed.cell.error() != nullptr);
    CHECK(failed.cell.error()->name == "ExitCode");
    CHECK(failed.cell.error()->value == "1");
    auto scoped = in_shell;
    scoped.env = {{"GREETING", "hi"}};
    CHECK(cell("echo $GREETING; sh -c 'echo child $GREETING'", scoped).out.text() ==
          "hi\nchild hi\n");
    CHECK(cell("echo ${GREETING-unset}", in_shell).out.text() == "unset\n");

    auto slow =
        run(kernel.async_run(box, "echo waiting\nsleep 30\necho never", 1s, {}, {}, {}, in_shell));
    REQUIRE(slow);
    CHECK(slow->how == moat::cell_outcome::ending::interrupted);
    CHECK(slow->out.text() == "waiting\n");
    CHECK(cell("echo $PWD $KEPT", in_shell).out.text() == "/workspace yes\n");
    CHECK(shown("'the default context is python'") == "'the default context is python'");
}

TEST_CASE_FIXTURE(kernel_fixture,
                  "a javascript context keeps its variables, shows a last expression and an "
                  "error, and keeps its state through an interrupt") {
    MOAT_REQUIRE_NAMESPACES();
    const auto node = context("js", "");
    CHECK(node.language == "javascript");
    CHECK(shown("let x = 41\nconsole.log('set', x)", node.id) == "set 41\n");
    CHECK(shown("x + 1", node.id) == "42");
    CHECK(shown("({city: 'Oslo', n: [1, 2]})", node.id) == "{ city: 'Oslo', n: [ 1, 2 ] }");
    CHECK(shown("Promise.resolve('awaited')", node.id) == "'awaited'");
    moat::cell_options in_node;
    in_node.context = node.id;
    const auto failed = cell("missing.field", in_node);
    REQUIRE(failed.cell.error() != nullptr);
    CHECK(failed.cell.error()->name == "ReferenceError");
    CHECK(failed.cell.error()->value == "missing is not defined");

    auto spin = run(kernel.async_run(box, "while (true) {}", 1s, {}, {}, {}, in_node));
    REQUIRE(spin);
    CHECK(spin->how == moat::cell_outcome::ending::interrupted);
    CHECK(shown("x", node.id) == "41");
}
