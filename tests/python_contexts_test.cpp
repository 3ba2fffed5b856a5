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
        REQUIRE(ran);
        return std::move(*ran);
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
    auto in_tmp = run(kernel.async_create_context(box, "python", "/tmp"));
    REQUIRE(in_tmp);
    CHECK(in_tmp->language == "python");
    auto other = run(kernel.async_create_context(box, "", ""));
    REQUIRE(other);
    CHECK(in_tmp->id != other->id);

    CHECK(shown("x = 'default'\nx") == "'default'");
    CHECK(shown("x = 'tmp'\nimport os\nos.getcwd()", in_tmp->id) == "'/tmp'");
    CHECK(shown("import os\nos.getcwd()", other->id) == "'/workspace'");
    CHECK(shown("x", other->id) == "NameError");
    CHECK(shown("x = 'other'\nx", other->id) == "'other'");
    CHECK(shown("x", in_tmp->id) == "'tmp'");
    CHECK(shown("x") == "'default'");

    auto listed = run(kernel.async_list_contexts(box));
    REQUIRE(listed);
    CHECK(listed->size() == 3);
    const auto found = std::find_if(listed->begin(), listed->end(),
                                    [&](const auto& c) { return c.id == in_tmp->id; });
    REQUIRE(found != listed->end());
    CHECK(found->cwd == "/tmp");

    REQUIRE(run(kernel.async_restart_context(box, in_tmp->id)));
    CHECK(shown("x", in_tmp->id) == "NameError");
    CHECK(shown("import os\nos.getcwd()", in_tmp->id) == "'/tmp'");
    CHECK(shown("x", other->id) == "'other'");

    REQUIRE(run(kernel.async_remove_context(box, other->id)));
    auto gone = run(kernel.async_run(box, "1", 10s, {}, {}, {}, moat::cell_options{other->id, {}}));
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
