#include <moat/tools.hpp>

#include "core/json_writer.hpp"

namespace moat {
namespace {

const char* to_string(file_type type) noexcept {
    switch (type) {
        case file_type::regular:
            return "file";
        case file_type::directory:
            return "directory";
        case file_type::symlink:
            return "symlink";
        case file_type::other:
            return "other";
    }
    return "other";
}

void text_if_present(json_writer& w, std::string_view name, const std::string& text) {
    if (!text.empty()) w.key(name).value(text);
}

void artifacts_if_present(json_writer& w, std::string_view name,
                          const std::vector<artifact>& list) {
    if (list.empty()) return;
    w.key(name).begin_array();
    for (const auto& a : list) {
        w.begin_object();
        w.key("path").value(a.path);
        w.key("size").value(a.size);
        w.key("media_type").value(a.media_type);
        w.end_object();
    }
    w.end_array();
}

}  // namespace

const char* to_string(tool_status status) noexcept {
    switch (status) {
        case tool_status::ok:
            return "ok";
        case tool_status::error:
            return "error";
        case tool_status::timeout:
            return "timeout";
        case tool_status::unavailable:
            return "unavailable";
    }
    return "error";
}

std::string tool_result::to_json() const {
    const bool is_ok = status == tool_status::ok;
    json_writer w;
    w.begin_object();
    w.key("status").value(to_string(status));
    if (exit_code) w.key("exit_code").value(*exit_code);
    if (exit_code || (tool == "read_process_output" && !processes.empty())) {
        w.key("stdout").value(stdout_text);
        w.key("stderr").value(stderr_text);
        w.key("truncated").value(stdout_omitted != 0 || stderr_omitted != 0);
        if (stdout_omitted != 0 || stderr_omitted != 0) {
            w.key("omitted_chars").begin_object();
            if (stdout_omitted != 0) w.key("stdout").value(stdout_omitted);
            if (stderr_omitted != 0) w.key("stderr").value(stderr_omitted);
            w.end_object();
        }
    }
    w.key("duration_ms").value(static_cast<std::int64_t>(duration.count()));
    text_if_present(w, "error_type", error_type);
    text_if_present(w, "error_code", error_code);
    text_if_present(w, "traceback", traceback);
    text_if_present(w, "message", message);
    text_if_present(w, "hint", hint);
    if (!notices.empty()) {
        w.key("notices").begin_array();
        for (const auto& notice : notices) w.value(notice);
        w.end_array();
    }
    text_if_present(w, "path", path);
    // A failed read or listing says nothing about the file: no empty content, size or listing.
    if (tool == "read_file" && is_ok) {
        w.key("encoding").value(encoding == file_encoding::base64 ? "base64" : "text");
        w.key("truncated").value(content_omitted != 0);
        if (content_omitted != 0) {
            w.key("omitted_chars").begin_object().key("content").value(content_omitted);
            w.end_object();
        }
    }
    if (tool == "read_file" && (is_ok || !content.empty())) w.key("content").value(content);
    if ((tool == "read_file" || tool == "write_file") && (is_ok || bytes != 0)) {
        w.key("bytes").value(bytes);
    }
    if (tool == "list_files" && (is_ok || !entries.empty())) {
        w.key("entries").begin_array();
        for (const auto& entry : entries) {
            w.begin_object();
            w.key("name").value(entry.name);
            w.key("type").value(to_string(entry.type));
            w.key("size").value(entry.size);
            w.end_object();
        }
        w.end_array();
    }
    artifacts_if_present(w, "images", images);
    artifacts_if_present(w, "artifacts", artifacts);
    if (artifacts_truncated) w.key("artifacts_truncated").value(true);
    if (!processes.empty() || (tool == "list_processes" && is_ok)) {
        w.key("processes").begin_array();
        for (const auto& p : processes) {
            w.begin_object();
            w.key("id").value(p.id);
            w.key("command").value(p.command);
            w.key("cwd").value(p.cwd);
            w.key("running").value(p.is_running);
            if (p.exit_code) w.key("exit_code").value(*p.exit_code);
            w.key("stdout_bytes").value(p.stdout_bytes);
            w.key("stderr_bytes").value(p.stderr_bytes);
            w.end_object();
        }
        w.end_array();
    }
    w.end_object();
    return w.take();
}

}  // namespace moat
