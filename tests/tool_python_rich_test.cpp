// run_python as a notebook cell through the C++ tool layer, on the real local backend with the
// host's python3 (IPython, matplotlib and pandas from scripts/install-deps): the last expression's
// value, magics and `!` lines, a structured error, figures saved as artifacts, rich values in the
// cell's record, and the time limit that interrupts before it kills. Then the same result model
// from the plain interpreter (MOAT_PLAIN_PYTHON=1), as in a sandbox without IPython.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "support/local_fixture.hpp"

#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

bool has_notice(const moat::tool_result& r, const std::string& part) {
    for (const auto& n : r.notices)
        if (n.find(part) != std::string::npos) return true;
    return false;
}

struct notebook : local_fixture {
    explicit notebook(bool plain = false)
        : rt(*local), manager(rt, options(plain)), tools(manager, "notebook") {}
    ~notebook() { (void)run(manager.async_shutdown()); }

    static moat::manager_options options(bool plain) {
        moat::manager_options o;
        o.spec.labels["test"] = "tools-rich";
        if (plain) o.spec.env["MOAT_PLAIN_PYTHON"] = "1";
        return o;
    }

    moat::tool_result python(const std::string& code,
                             std::optional<std::chrono::milliseconds> timeout = {}) {
        auto r = run(tools.async_run_python(code, timeout));
        REQUIRE(r);
        INFO(r->to_json());
        CHECK(r->to_json().find("\\u0000") == std::string::npos);
        return *r;
    }

    moat::runtime rt;
    moat::session_manager manager;
    moat::tool_session tools;
};

struct plain_notebook : notebook {
    plain_notebook() : notebook(true) {}
};

constexpr std::string_view png_signature = "\x89PNG\r\n\x1a\n";

}  // namespace

TEST_CASE_FIXTURE(notebook,
                  "run_python shows the last expression, runs ! and % lines, and reports an "
                  "exception by name, value and traceback with the state kept") {
    MOAT_REQUIRE_NAMESPACES();
    CHECK(python("x = 20").cell.execution_count == 1);
    auto value = python("x * 2 + 2");
    CHECK(value.stdout_text == "42\n");
    REQUIRE(value.cell.main_result() != nullptr);
    CHECK(value.cell.main_result()->text() == "42");
    CHECK(value.cell.execution_count == 2);
    CHECK(python("x;").stdout_text.empty());  // a trailing semicolon hides the value

    auto lines = python("!echo hi from a shell\n%cd /tmp\n%pwd");
    CHECK(lines.status == moat::tool_status::ok);
    CHECK(lines.stdout_text == "hi from a shell\n/tmp\n'/tmp'\n");
    CHECK(python("import os\nos.getcwd()").stdout_text == "'/tmp'\n");
    CHECK(python("%env MOAT_CELL_VARIABLE=seen\n!echo $MOAT_CELL_VARIABLE").stdout_text ==
          "env: MOAT_CELL_VARIABLE=seen\nseen\n");
    CHECK(python("%cd /workspace").status == moat::tool_status::ok);
    CHECK(python("%matplotlib inline").status == moat::tool_status::ok);

    auto failed = python("print('before')\ndef f(d):\n    return d['price']\nf({})");
    CHECK(failed.status == moat::tool_status::error);
    CHECK(failed.stdout_text == "before\n");
    CHECK(failed.error_type == "KeyError");
    CHECK(failed.traceback.find(".cells/") != std::string::npos);
    CHECK(failed.traceback.find("line 3, in f") != std::string::npos);
    CHECK(failed.traceback.ends_with("KeyError: 'price'\n"));
    CHECK(failed.traceback.find("interactiveshell") == std::string::npos);
    CHECK(failed.stderr_text.empty());
    const auto* error = failed.cell.error();
    REQUIRE(error != nullptr);
    CHECK(error->name == "KeyError");
    CHECK(error->value == "'price'");
    CHECK(error->traceback.starts_with("Traceback (most recent call last):"));
    CHECK(python("x").stdout_text == "20\n");
}

TEST_CASE_FIXTURE(notebook,
                  "a matplotlib chart is saved as a PNG artifact, listed by path, media type and "
                  "size, never as bytes in the model's text") {
    MOAT_REQUIRE_NAMESPACES();
    auto chart = python(
        "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('squares')\n"
        "print('drawn')");
    CHECK(chart.status == moat::tool_status::ok);
    CHECK(chart.stdout_text.find("drawn\n") == 0);
    REQUIRE(chart.images.size() == 1);
    const auto& image = chart.images[0];
    CHECK(image.media_type == "image/png");
    CHECK(image.path.starts_with("figure-"));
    CHECK(image.path.ends_with("-1.png"));
    CHECK(image.size > 1000);
    bool listed = false;
    for (const auto& a : chart.artifacts) listed = listed || a.path == image.path;
    CHECK(listed);
    const auto json = chart.to_json();
    CHECK(json.find("\"images\":[{\"path\":\"" + image.path) != std::string::npos);
    CHECK(json.find("iVBOR") == std::string::npos);  // no base64 PNG in the model's text
    CHECK(json.size() < 4000);
    auto bytes = run(tools.async_read_artifact(image.path));
    REQUIRE(bytes);
    CHECK(bytes->starts_with(png_signature));
    CHECK(bytes->size() == image.size);
    const auto results = chart.cell.results();
    REQUIRE(results.size() == 1);
    CHECK_FALSE(results[0]->is_main_result);
    REQUIRE(results[0]->find("image/png") != nullptr);
    CHECK(results[0]->find("image/png")->data == *bytes);

    // plt.show() hands the figure over where it is called; the figure is closed after.
    auto shown = python("plt.plot([1, 2])\nplt.show()\nprint('after')");
    CHECK(shown.images.size() == 1);
    REQUIRE(shown.cell.events.size() == 2);
    CHECK(std::holds_alternative<moat::display_result>(shown.cell.events[0]));
    CHECK(python("len(plt.get_fignums())").stdout_text == "0\n");
}

TEST_CASE_FIXTURE(notebook, "a pandas DataFrame reaches the model as text and the record as HTML") {
    MOAT_REQUIRE_NAMESPACES();
    auto frame = python(
        "import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], "
        "'people': [709000, 10092000]})");
    CHECK(frame.status == moat::tool_status::ok);
    CHECK(frame.stdout_text.find("Oslo") != std::string::npos);
    CHECK(frame.stdout_text.find("10092000") != std::string::npos);
    CHECK(frame.stdout_text.find("<table") == std::string::npos);
    const auto* main = frame.cell.main_result();
    REQUIRE(main != nullptr);
    REQUIRE(main->find("text/html") != nullptr);
    CHECK(main->find("text/html")->data.find("<table") != std::string::npos);
    CHECK(main->find("text/html")->data.find("Lima") != std::string::npos);
    // A value with no text of its own but HTML: the model reads the HTML.
    auto html = python("from IPython.display import HTML\nHTML('<b>bold</b>')");
    CHECK(html.stdout_text == "<b>bold</b>\n");
}

TEST_CASE_FIXTURE(notebook,
                  "a cell past its limit is interrupted and keeps the interpreter, and one that "
                  "ignores the interrupt is killed and restarted, saying so") {
    MOAT_REQUIRE_NAMESPACES();
    python("import os, time\nkept = 5");
    const auto pid = python("os.getpid()").stdout_text;
    auto slow = python("print('started')\nwhile True:\n    time.sleep(0.05)", 1s);
    CHECK(slow.status == moat::tool_status::timeout);
    CHECK(slow.exit_code == 124);
    CHECK(slow.message.find("interrupted") != std::string::npos);
    CHECK(slow.message.find("kept") != std::string::npos);
    CHECK(slow.error_type == "KeyboardInterrupt");
    CHECK(slow.stdout_text == "started\n");
    CHECK_FALSE(has_notice(slow, "restarted"));
    auto after = python("print(kept)\nos.getpid()");
    CHECK(after.stdout_text == "5\n" + pid);
    CHECK(after.notices.empty());

    auto stubborn = python(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", 1s);
    CHECK(stubborn.status == moat::tool_status::timeout);
    CHECK(stubborn.message.find("did not stop when interrupted") != std::string::npos);
    CHECK(has_notice(stubborn, "interpreter restarted"));
    CHECK(python("os.getpid()").error_type == "NameError");
}

TEST_CASE_FIXTURE(plain_notebook,
                  "without IPython the plain interpreter gives the same results and says what a "
                  "magic line needs") {
    MOAT_REQUIRE_NAMESPACES();
    CHECK(python("'IPython' in __import__('sys').modules").stdout_text == "False\n");
    CHECK(python("x = 6\nx * 7").stdout_text == "42\n");
    auto magic = python("%pwd");
    CHECK(magic.status == moat::tool_status::error);
    CHECK(magic.error_type == "UsageError");
    REQUIRE(magic.cell.error() != nullptr);
    CHECK(magic.cell.error()->value.find("IPython is not installed") != std::string::npos);
    CHECK(python("!echo hi").cell.error()->value.find("subprocess") != std::string::npos);
    auto rich = python(
        "class Card:\n    def _repr_html_(self):\n        return '<i>card</i>'\n"
        "    def _repr_markdown_(self):\n        return '*card*'\nCard()");
    REQUIRE(rich.cell.main_result() != nullptr);
    CHECK(rich.cell.main_result()->find("text/html")->data == "<i>card</i>");
    CHECK(rich.stdout_text == "<i>card</i>\n");
    auto shown = python("display(1, 'two')\n3");
    REQUIRE(shown.cell.results().size() == 3);
    CHECK_FALSE(shown.cell.results()[0]->is_main_result);
    CHECK(shown.stdout_text == "1\n'two'\n3\n");
    auto chart = python("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([3, 1])");
    CHECK(chart.status == moat::tool_status::ok);
    REQUIRE(chart.images.size() == 1);
    auto bytes = run(tools.async_read_artifact(chart.images[0].path));
    REQUIRE(bytes);
    CHECK(bytes->starts_with(png_signature));
    auto failed = python("1 / 0");
    CHECK(failed.error_type == "ZeroDivisionError");
    CHECK(failed.cell.error()->value == "division by zero");
    CHECK(failed.traceback.find("<string>") == std::string::npos);
}
