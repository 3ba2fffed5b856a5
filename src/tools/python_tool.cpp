// run_python: a cell through the session's interpreter (python_kernel), turned into a tool_result
// worded for the model. What the model reads of a cell is its stdout with each display result's
// text in its place (the value of a last expression as a REPL shows it; a value whose only text
// is Python's default repr by its HTML or Markdown, clamped), the error's type and traceback, and
// the figures and images, which are saved under the artifacts directory and listed by path, media
// type and size, never as bytes in the text.
#include "tools/tool_session_state.hpp"

#include "core/output_capture.hpp"

#include <algorithm>
#include <memory>

namespace moat {

using tool_detail::capture_limits;
using tool_detail::hint_for_python_error;
using tool_detail::notice_rebuilt;
using tool_detail::notice_restarted;
using tool_detail::seconds_text;
using tool_detail::signal_name;

namespace {

// An HTML or Markdown result in the model's text: its head and tail.
constexpr shaping_limits rich_text_limits{2000, 1000, 4000};

// The image representations saved as files, in the order one is chosen, with their extensions.
constexpr std::pair<std::string_view, std::string_view> image_types[] = {
    {media::image_png, "png"}, {media::image_jpeg, "jpg"}, {media::image_svg, "svg"}};

const representation* image_of(const display_result& r) {
    for (const auto& [type, extension] : image_types)
        if (const auto* found = r.find(type)) return found;
    return nullptr;
}

std::string_view extension_for(std::string_view media_type) {
    for (const auto& [type, extension] : image_types)
        if (type == media_type) return extension;
    return "bin";
}

// "<__main__.Thing object at 0x7f...>", "<IPython.core.display.HTML object>": nothing to read.
bool is_default_repr(std::string_view text) {
    return text.starts_with('<') && text.ends_with('>') &&
           (text.find(" object") != std::string_view::npos ||
            text.find(" at 0x") != std::string_view::npos);
}

// What the model reads of a display result in the cell's stdout ("" for an image: it is a file).
std::string model_text(const display_result& r) {
    if (image_of(r) != nullptr) return {};
    std::string text(r.text());
    if (text.empty() || is_default_repr(text)) {
        for (const auto type : {media::text_html, media::text_markdown, media::text_latex}) {
            if (const auto* rich = r.find(type)) {
                text = shape_for_model(rich->data, rich_text_limits).text;
                break;
            }
        }
    }
    if (!text.empty() && text.back() != '\n') text += '\n';
    return text;
}

std::string size_text(std::uint64_t bytes) {
    if (bytes < 1024 * 1024) return std::to_string((bytes + 1023) / 1024) + " KiB";
    return std::to_string((bytes + 1024 * 1024 - 1) / (1024 * 1024)) + " MiB";
}

// Notices for what the cell's bounds dropped.
void add_drop_notices(tool_result& r, const cell_result& cell) {
    for (const auto* shown : cell.results()) {
        for (const auto& dropped : shown->dropped) {
            if (dropped.media_type.starts_with("image/")) {
                r.notices.push_back("an image (" + dropped.media_type + ", " +
                                    size_text(dropped.size) +
                                    ") was over the size limit and was not saved: save it "
                                    "smaller (a lower dpi) with savefig");
            }
        }
    }
    if (cell.dropped_results != 0) {
        r.notices.push_back(std::to_string(cell.dropped_results) +
                            " more results (display() calls, figures) were dropped: show fewer "
                            "per call");
    }
}

}  // namespace

asio::awaitable<void> tool_session::state::save_images(tool_result& r, sandbox& box,
                                                       std::uint64_t cell_number, deadline limit) {
    std::vector<file_write> files;
    std::vector<artifact> saved;
    const std::string number = std::to_string(1000 + cell_number).substr(1);
    for (const auto* shown : r.cell.results()) {
        const auto* image = image_of(*shown);
        if (image == nullptr) continue;
        artifact a;
        a.path = "figure-" + number + "-" + std::to_string(saved.size() + 1) + "." +
                 std::string(extension_for(image->media_type));
        a.media_type = image->media_type;
        a.size = image->data.size();
        file_write w;
        w.path = layout.artifacts_dir + "/" + a.path;
        w.content = image->data;
        files.push_back(std::move(w));
        saved.push_back(std::move(a));
    }
    if (files.empty()) co_return;
    auto written = co_await write_files(box, std::move(files), limit);
    if (!written) {
        r.notices.emplace_back("the cell's figures could not be saved: the sandbox did not answer");
        co_return;
    }
    for (std::size_t i = 0; i < saved.size() && i < written->size(); ++i) {
        if ((*written)[i].outcome) {
            r.images.push_back(std::move(saved[i]));
        } else {
            r.notices.push_back("the figure " + saved[i].path + " could not be saved: " +
                                tool_detail::model_message((*written)[i].outcome.error()));
        }
    }
}

asio::awaitable<result<tool_result>> tool_session::state::run_python(
    std::string code, std::chrono::milliseconds timeout, deadline limit,
    output_callback on_output) {
    auto got = co_await lease(limit);
    if (!got) co_return failed_step("run_python", std::move(got).error());
    auto box = got->lease.box;
    if (got->moved) generation = 0;  // a new sandbox: its interpreters count from 1
    // The model's stdout: the cell's own, with each display result's text in its place.
    auto shown = std::make_shared<output_capture>(capture_limits);
    auto on_stream = [shown, on_output = std::move(on_output)](output_channel channel,
                                                               std::string_view data) {
        if (channel == output_channel::out) shown->append(data);
        if (on_output) on_output(channel, data);
    };
    auto on_event = [shown](const cell_event& event) {
        if (const auto* result = std::get_if<display_result>(&event)) {
            shown->append(model_text(*result));
        }
    };
    cell_options in_default_context;  // a named local (g++ 12)
    auto ran = co_await kernel.async_run(box, std::move(code), timeout, limit, std::move(on_stream),
                                         std::move(on_event), std::move(in_default_context));
    // A stopped call may have taken the interpreter with it: the next cell sees a later
    // generation then, and says so.
    if (!ran) co_return failed_step("run_python", std::move(ran).error());
    tool_result r;
    r.tool = "run_python";
    r.duration = ran->duration;
    auto& outcome = *ran;
    if (outcome.how == cell_outcome::ending::busy) {
        r.status = tool_status::error;
        r.error_code = "busy";
        r.message =
            "another call is running Python in this conversation's sandbox and did "
            "not finish within " +
            seconds_text(std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30))) +
            "; this code did not run";
        r.hint = "call " + named("run_python") + " again";
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        co_return r;
    }
    const bool restarted_unseen = generation != 0 && outcome.generation > generation;
    if (got->rebuilt) {
        r.notices.emplace_back(notice_rebuilt);
    } else if (restarted_unseen && outcome.how == cell_outcome::ending::completed) {
        r.notices.emplace_back(notice_restarted);
    }
    generation = outcome.generation;
    // A result that says the interpreter restarted announces its successor too.
    const bool restarts = outcome.how == cell_outcome::ending::timed_out ||
                          outcome.how == cell_outcome::ending::crashed;
    if (restarts) generation = outcome.generation + 1;
    r.cell = std::move(outcome.cell);
    auto shaped_out = shape(shown->finish());
    r.stdout_text = std::move(shaped_out.text);
    r.stdout_omitted = shaped_out.omitted_chars;
    set_stderr(r, shape(outcome.err));
    if (outcome.raised) {
        const cell_error* failure = r.cell.error();
        r.error_type = failure != nullptr ? failure->name : outcome.exception_type;
        if (failure != nullptr) {
            r.traceback = python_traceback(failure->traceback);
            if (r.traceback.empty()) {
                r.traceback = shape_for_model(failure->traceback, rich_text_limits).text;
            }
        }
    }
    const std::string more_time =
        "make it faster, work on less data, or pass a larger timeout_seconds (at most " +
        std::to_string(options.max_timeout.count()) + ")";
    switch (outcome.how) {
        case cell_outcome::ending::completed:
            if (!outcome.raised) {
                r.status = tool_status::ok;
                r.exit_code = 0;
                if (outcome.out.total_bytes == 0 && outcome.err.total_bytes == 0 &&
                    r.cell.results().empty()) {
                    r.notices.emplace_back(
                        "ran successfully but printed nothing; use print() to see values");
                }
                break;
            }
            r.status = tool_status::error;
            r.exit_code = 1;
            r.hint =
                hint_for_python_error(r.error_type, named("list_files"), layout.workdir, network);
            break;
        case cell_outcome::ending::interrupted:
            r.status = tool_status::timeout;
            r.exit_code = 124;
            r.message = "the code ran past its " + seconds_text(timeout) +
                        " limit and was interrupted (KeyboardInterrupt); variables and imports "
                        "are kept";
            r.hint = more_time;
            break;
        case cell_outcome::ending::timed_out:
            r.status = tool_status::timeout;
            r.exit_code = 124;
            r.message = "the code ran past its " + seconds_text(timeout) +
                        " limit, did not stop when interrupted, and was killed";
            r.hint = more_time + "; re-run the code that defined the variables you need";
            r.notices.emplace_back(notice_restarted);
            break;
        case cell_outcome::ending::crashed:
            r.status = tool_status::error;
            r.exit_code = outcome.exit_code;
            if (outcome.oom_killed) {
                r.message = "the interpreter was killed: the sandbox ran out of memory";
                r.hint = "use less memory: process the data in parts";
            } else if (outcome.signal != 0) {
                r.message =
                    std::string("the interpreter crashed (") + signal_name(outcome.signal) + ")";
                r.hint =
                    "avoid the call that crashed it; re-run the code that defined the "
                    "variables you need";
            } else {
                r.message = "the interpreter exited with code " +
                            std::to_string(outcome.exit_code) +
                            " (os._exit or a fatal error) instead of finishing the cell";
                r.hint =
                    "do not exit the interpreter; re-run the code that defined the "
                    "variables you need";
            }
            r.notices.emplace_back(notice_restarted);
            break;
        case cell_outcome::ending::busy:
            break;  // answered above
    }
    add_drop_notices(r, r.cell);
    co_await save_images(r, *box, outcome.cell_number, limit);
    co_await add_artifacts(r, *box, limit);
    co_return r;
}

}  // namespace moat
