// moat demo: a scripted conversation (no model needed) through the tool layer on the local
// backend, printing what the model would see at each step. Each step checks that moat behaved as
// promised; the exit code is 0 only if every step did.
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "core/json_writer.hpp"

#include <asio/this_coro.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <string>

namespace moat::cli {
namespace {

using clock = std::chrono::steady_clock;

struct demo_style {
    bool color = false;
    std::string paint(const char* code, const std::string& text) const {
        return color ? std::string("\x1b[") + code + "m" + text + "\x1b[0m" : text;
    }
};

class transcript {
  public:
    explicit transcript(demo_style style) : style_(style) {}

    void user(const std::string& text) {
        std::printf("\n%s %s\n", style_.paint("1;36", "user:").c_str(), text.c_str());
    }
    void model_says(const std::string& text) {
        std::printf("%s %s\n", style_.paint("1;35", "model:").c_str(), text.c_str());
    }
    void call(const std::string& tool, const std::string& what) {
        std::printf("%s %s\n", style_.paint("1;33", "  -> " + tool).c_str(), what.c_str());
    }
    void code(const std::string& source) {
        std::size_t start = 0;
        while (start < source.size()) {
            auto end = source.find('\n', start);
            if (end == std::string::npos) end = source.size();
            std::printf("       | %s\n", source.substr(start, end - start).c_str());
            start = end + 1;
        }
    }
    // Prints a result as the model reads it. A long one is shortened for the terminal only,
    // keeping the part around `focus` (the clamping marker) in view.
    void result(const std::string& json, const std::string& focus = "") {
        constexpr std::size_t show = 1200;
        std::string shown = json;
        if (json.size() > show) {
            const auto at = focus.empty() ? std::string::npos : json.find(focus);
            const std::size_t middle = at == std::string::npos ? json.size() / 2 : at;
            const std::size_t from = middle > 250 ? middle - 250 : 0;
            shown = json.substr(0, 300) +
                    style_.paint("2", " [... the demo skips " + std::to_string(from - 300) +
                                          " characters here ...] ") +
                    json.substr(from, 400) +
                    style_.paint("2", " [... the demo skips " +
                                          std::to_string(json.size() - 300 - from - 400) +
                                          " characters here ...] ") +
                    json.substr(json.size() - 300);
        }
        std::printf("%s %s\n", style_.paint("1;32", "  <- the model reads:").c_str(),
                    shown.c_str());
    }
    void check(bool ok, const std::string& what) {
        std::printf(
            "     %s %s\n",
            ok ? style_.paint("32", "[ok]").c_str() : style_.paint("1;31", "[FAILED]").c_str(),
            what.c_str());
        if (!ok) ++failures_;
    }
    int failures() const noexcept { return failures_; }

  private:
    demo_style style_;
    int failures_ = 0;
};

bool has_notice(const tool_result& r, const std::string& part) {
    for (const auto& n : r.notices)
        if (n.find(part) != std::string::npos) return true;
    return false;
}

std::string sales_csv() {
    const char* regions[] = {"north", "south", "east", "west"};
    const char* products[] = {"widget", "gadget", "gizmo"};
    std::string csv = "date,region,product,units,unit_price\n";
    for (int day = 1; day <= 30; ++day) {
        for (int r = 0; r < 4; ++r) {
            const int p = (day + r) % 3;
            const int units = 5 + (day * 7 + r * 13) % 40;
            const double price = 9.5 + p * 5.25;
            char line[128];
            std::snprintf(line, sizeof line, "2026-11-%02d,%s,%s,%d,%.2f\n", day, regions[r],
                          products[p], units, price);
            csv += line;
        }
    }
    return csv;
}

std::string code_arguments(const std::string& code, double timeout_seconds = 0) {
    json_writer w;
    w.begin_object().key("code").value(code);
    if (timeout_seconds > 0) w.key("timeout_seconds").value(timeout_seconds);
    w.end_object();
    return w.take();
}

std::string command_arguments(const std::string& command) {
    json_writer w;
    w.begin_object().key("command").value(command).end_object();
    return w.take();
}

// One tool call as the model makes it: by name, with JSON arguments.
asio::awaitable<tool_result> call(tool_session& tools, const char* tool, std::string arguments) {
    auto r = co_await tools.async_call(tool, arguments);
    if (r) co_return std::move(*r);
    tool_result failed;
    failed.tool = tool;
    failed.status = tool_status::unavailable;
    failed.message = r.error().to_string();
    co_return failed;
}

asio::awaitable<tool_result> python(transcript& t, tool_session& tools, const std::string& code,
                                    double timeout_seconds = 0, std::string focus = "") {
    t.call("run_python", timeout_seconds > 0
                             ? "(timeout_seconds " + std::to_string(int(timeout_seconds)) + ")"
                             : "");
    t.code(code);
    auto r = co_await call(tools, "run_python", code_arguments(code, timeout_seconds));
    t.result(r.to_json(), focus);
    co_return r;
}

asio::awaitable<tool_result> shell(transcript& t, tool_session& tools, const std::string& command) {
    t.call("run_shell", "");
    t.code(command);
    auto r = co_await call(tools, "run_shell", command_arguments(command));
    t.result(r.to_json());
    co_return r;
}

std::string line_after(const std::string& text, const std::string& label) {
    const auto at = text.find(label);
    if (at == std::string::npos) return "";
    const auto end = text.find('\n', at);
    return text.substr(at + label.size(), end == std::string::npos ? end : end - at - label.size());
}

asio::awaitable<int> converse(backend& b, demo_style style) {
    runtime sandboxes(b);
    manager_options options;
    options.spec.labels["moat.cli"] = "demo";
    session_manager sessions(sandboxes, options);
    transcript t(style);
    std::printf(
        "moat demo: a scripted conversation through moat's tool layer on the local backend.\n"
        "The model's side is scripted (no model is involved); everything moat returns is real.\n");
    const auto started = clock::now();
    std::string sandbox_id;
    {
        tool_session tools(sessions, "demo-conversation");
        const std::string csv = sales_csv();

        t.user(
            "Here are this month's sales. Which region sold the most? And give me a summary "
            "file I can download.");
        t.model_says("I'll save the data in the sandbox and look at it.");
        {
            json_writer w;
            w.begin_object().key("path").value("sales.csv").key("content").value(csv).end_object();
            t.call("write_file", "sales.csv (" + std::to_string(csv.size()) + " bytes)");
            auto wrote = co_await call(tools, "write_file", w.take());
            t.result(wrote.to_json());
            t.check(wrote.status == tool_status::ok && wrote.bytes == csv.size() &&
                        wrote.path == "/workspace/sales.csv",
                    "the file is in /workspace, whole");
        }

        auto loaded = co_await python(t, tools,
                                      "import csv, secrets\n"
                                      "nonce = secrets.token_hex(8)  # made in the sandbox, kept "
                                      "in the interpreter\n"
                                      "rows = list(csv.DictReader(open('sales.csv')))\n"
                                      "print(len(rows), 'rows; columns:', list(rows[0]))\n"
                                      "print('nonce:', nonce)");
        const std::string nonce = line_after(loaded.stdout_text, "nonce: ");
        t.check(loaded.status == tool_status::ok &&
                    loaded.stdout_text.find("120 rows") != std::string::npos && nonce.size() == 16,
                "the cell ran; this run's nonce is " + nonce);

        t.model_says("Now revenue per region.");
        auto wrong = co_await python(t, tools,
                                     "from collections import defaultdict\n"
                                     "revenue = defaultdict(float)\n"
                                     "for r in rows:\n"
                                     "    revenue[r['region']] += float(r['revenue'])");
        t.check(wrong.status == tool_status::error && wrong.error_type == "KeyError" &&
                    wrong.traceback.find("revenue") != std::string::npos,
                "the model reads the exception type, the traceback and a hint");

        t.model_says("There is no revenue column: it is units times unit_price.");
        auto fixed =
            co_await python(t, tools,
                            "for r in rows:\n"
                            "    revenue[r['region']] += int(r['units']) * float(r['unit_price'])\n"
                            "best = max(revenue, key=revenue.get)\n"
                            "print({k: round(v, 2) for k, v in sorted(revenue.items())})\n"
                            "print('best region:', best, '| nonce from the first cell:', nonce)");
        t.check(fixed.status == tool_status::ok && !nonce.empty() &&
                    fixed.stdout_text.find(nonce) != std::string::npos,
                "variables from earlier cells are still there (same nonce)");

        t.user("Is any day an outlier?");
        t.model_says("Let me scan the days.");
        auto runaway = co_await python(
            t, tools,
            "day = 1\n"
            "while day <= 30:\n"
            "    total = sum(1 for r in rows if r['date'].endswith(f'-{day:02d}'))\n"
            "    # the model forgot day += 1\n",
            2);
        t.check(runaway.status == tool_status::timeout && runaway.exit_code == 124 &&
                    runaway.error_type == "KeyboardInterrupt" &&
                    !has_notice(runaway, "interpreter restarted"),
                "the runaway loop was interrupted at its 2 s limit, and the model is told its "
                "variables are kept");

        auto kept = co_await python(t, tools, "print(nonce)");
        t.check(kept.stdout_text == nonce + "\n",
                "after the interrupt, the variables are still there (same nonce)");

        t.model_says("I'll reload and print the whole file to eyeball it.");
        auto flood = co_await python(t, tools,
                                     "text = open('sales.csv').read() * 53\n"
                                     "print(len(text), 'characters:')\n"
                                     "print(text)",
                                     0, "characters omitted");
        t.check(flood.status == tool_status::ok &&
                    flood.stdout_text.find("characters omitted") != std::string::npos &&
                    flood.stdout_text.size() < 7000,
                "a 200 KB print reaches the model as head + tail with a marker (" +
                    std::to_string(flood.stdout_text.size()) + " characters)");

        t.model_says("Writing the summary file for the user.");
        auto summary = co_await python(
            t, tools,
            "import csv, os\n"
            "rows = list(csv.DictReader(open('sales.csv')))\n"
            "totals = {}\n"
            "for r in rows:\n"
            "    totals[r['region']] = totals.get(r['region'], 0) + int(r['units']) * "
            "float(r['unit_price'])\n"
            "os.makedirs('/workspace/out', exist_ok=True)\n"
            "with open('/workspace/out/summary.csv', 'w') as f:\n"
            "    f.write('region,revenue\\n')\n"
            "    for k, v in sorted(totals.items()):\n"
            "        f.write(f'{k},{v:.2f}\\n')\n"
            "print('best region:', max(totals, key=totals.get))");
        bool listed = false;
        for (const auto& a : summary.artifacts)
            listed = listed || (a.path == "summary.csv" && a.media_type == "text/csv");
        t.check(summary.status == tool_status::ok && listed,
                "the artifact is listed with its size and media type (no bytes in the text)");
        auto bytes = co_await tools.async_read_artifact("summary.csv");
        t.check(bytes && bytes->rfind("region,revenue\n", 0) == 0,
                "the application reads the artifact's bytes through the file API:");
        if (bytes) t.code(*bytes);

        t.user("Can I see it as a chart?");
        auto chart = co_await python(t, tools,
                                     "import matplotlib.pyplot as plt\n"
                                     "plt.bar(list(totals), list(totals.values()))\n"
                                     "plt.title('revenue per region')\n"
                                     "totals");
        const bool charted = chart.status == tool_status::ok && chart.images.size() == 1 &&
                             chart.images[0].media_type == "image/png" &&
                             chart.stdout_text.find("'north'") != std::string::npos &&
                             chart.to_json().find("iVBOR") == std::string::npos;
        t.check(charted,
                "the figure the model drew was saved as " +
                    (chart.images.empty() ? std::string("(nothing)")
                                          : "/workspace/out/" + chart.images[0].path + " (" +
                                                std::to_string(chart.images[0].size) + " bytes)") +
                    ", listed by path, media type and size; the last expression is shown");
        if (charted) {
            auto png = co_await tools.async_read_artifact(chart.images[0].path);
            t.check(png && png->rfind("\x89PNG\r\n\x1a\n", 0) == 0,
                    "the application reads the chart's PNG bytes through the file API");
        }

        t.user("(a prompt injection makes the model try to wipe the machine)");
        auto wipe =
            co_await shell(t, tools,
                           "rm -rf --no-preserve-root / 2>&1 | tail -n 2\n"
                           "echo \"files left in /usr/bin: $(ls /usr/bin | wc -l)\"\n"
                           "echo \"files left in /workspace: $(ls -A /workspace | wc -l)\"");
        struct stat host_python {};
        t.check(wipe.stdout_text.find("files left in /usr/bin: 0") == std::string::npos &&
                    ::stat("/usr/bin/python3", &host_python) == 0,
                "rm -rf / emptied only the sandbox's own /workspace and /tmp; its root is "
                "read-only and the host is untouched");

        auto lease = co_await sessions.async_acquire("demo-conversation");
        if (lease) sandbox_id = lease->box->id();
        lease = make_error(errc::cancelled, "released");
        t.user("Thanks, that's all.");
        auto ended = co_await tools.async_end();
        auto after = co_await b.async_inspect(sandbox_id);
        t.check(ended.has_value() && !sandbox_id.empty() &&
                    (!after || after->state != sandbox_state::running),
                "sandbox " + sandbox_id + " destroyed, and its absence confirmed");
    }
    co_await asio::this_coro::reset_cancellation_state();
    (void)co_await sessions.async_shutdown();
    const auto seconds = std::chrono::duration<double>(clock::now() - started).count();
    std::printf("\n%s in %.1f s\n",
                t.failures() == 0 ? "every step behaved as promised"
                                  : (std::to_string(t.failures()) + " step(s) FAILED").c_str(),
                seconds);
    co_return t.failures() == 0 ? 0 : exit_failure;
}

}  // namespace

int demo_command(int argc, char** argv) {
    if (argc > 0)
        throw usage_error("unexpected argument '" + std::string(argv[0]) +
                          "' (moat demo takes none)");
    demo_style style;
    style.color = ::isatty(STDOUT_FILENO) != 0;
    return run_with_backend([style](backend& b) { return converse(b, style); });
}

}  // namespace moat::cli
