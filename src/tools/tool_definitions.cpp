#include <moat/tools.hpp>

#include "core/json_writer.hpp"
#include "egress/network_policy.hpp"

namespace moat {

namespace {

// Every bound a schema keyword states is also in the description text: some model APIs' schema
// conversion (Gemini's, through Google ADK) drops "maximum", "exclusiveMinimum" and
// "additionalProperties".
constexpr std::string_view timeout_schema =
    R"("timeout_seconds":{"type":"number","exclusiveMinimum":0,"maximum":600,)"
    R"("description":"Time limit for this call in seconds: more than 0 and at most 600 )"
    R"((default 30)."})";

// The schema of the tools that name a background process by its id.
constexpr std::string_view process_id_schema =
    R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,"description":"The process id from start_process (an integer of at least 1)."}},)"
    R"("required":["id"],"additionalProperties":false})";

// `text` inside a JSON string, without the quotes.
std::string json_inner(std::string_view text) {
    std::string quoted;
    append_json_string(quoted, text);
    return quoted.substr(1, quoted.size() - 2);
}

// What the network allows, as a sentence for the model.
std::string network_sentence(const sandbox_network& network, std::string_view when_off) {
    if (network.mode == network_mode::none) return std::string(when_off);
    std::string text = egress::describe_for_model(network);
    text[0] = static_cast<char>(text[0] - 'a' + 'A');
    return text + "; other hosts are refused (do not retry them). " +
           egress::describe_installs_for_model(network);
}

}  // namespace

// The descriptions are prompts: a model decides from them when to call a tool and what to expect.
// `p` prefixes every tool name, including the ones a description mentions; `w` is the working
// directory and `a` the artifacts directory in descriptions, `jw` the working directory in a
// schema's JSON text.
std::vector<tool_definition> tool_definitions(const sandbox_layout& layout, std::string_view prefix,
                                              const sandbox_network& network) {
    const std::string p(prefix);
    const std::string& w = layout.workdir;
    const std::string& a = layout.artifacts_dir;
    const std::string jw = json_inner(w);
    // Where the home directory is, when it is not the working directory.
    std::string home;
    if (layout.home != layout.workdir)
        home = " Your home directory ($HOME) is " + layout.home + ".";
    std::vector<tool_definition> tools;
    tools.push_back(tool_definition{
        p + "run_python",
        "Run Python 3 code in this conversation's sandbox, like a Jupyter notebook cell. State "
        "persists between calls: variables, imports and functions defined in one call are "
        "available in the next, and files stay in " +
            w + " (your working directory)." + home +
            " What the code prints is shown, and so is the value of the last expression (as in "
            "a notebook: a DataFrame as its text table; end the line with ; to hide it) and "
            "anything passed to display(). matplotlib figures are saved automatically as PNG "
            "files under " +
            a +
            " and listed in the result's images by path, media type and size (no need to call "
            "plt.savefig; plt.show() works); you do not see the picture itself. IPython "
            "commands work where IPython is installed (!ls, %cd, %pip, %env). "
            "Long output is cut to its head and tail, so print summaries (len(), df.head(), a "
            "slice) rather than whole datasets. Save files meant for the user under " +
            a + " (they are listed in the result as artifacts). " +
            network_sentence(network,
                             "The network is off: no pip install, no downloads; use the standard "
                             "library and what is already installed.") +
            " A call that runs past timeout_seconds (default 30, at most 600) is interrupted "
            "(KeyboardInterrupt; variables are kept); if it does not stop within 2 seconds more, "
            "the interpreter is restarted, losing variables. An exception is reported in the "
            "result (status, error_type, traceback): fix the code and call again.",
        R"({"type":"object","properties":{"code":{"type":"string","description":"Python source to run."},)" +
            std::string(timeout_schema) +
            R"(},"required":["code"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "run_shell",
        std::string("Run a shell command (/bin/sh -c) in this conversation's sandbox, in ") + w +
            " (your working directory)." + home +
            " Files "
            "persist between calls; shell variables and `cd` do not (each call is a new shell). "
            "Use it for file inspection (ls, head, wc, grep), running scripts and standard Unix "
            "tools. Only stdout and stderr are visible to you; long output is cut to its head and "
            "tail. Save files meant for the user under " +
            a + ". " + network_sentence(network, "The network is off: no package installs.") +
            " You are an unprivileged user: no sudo. A command runs for at most "
            "timeout_seconds (default 30, at most 600); a long program belongs in a script file "
            "(" +
            p +
            "write_file) run from here. What the command leaves running is stopped when it "
            "ends: start a server with " +
            p + "start_process.",
        R"({"type":"object","properties":{"command":{"type":"string","description":"The shell command line."},)" +
            std::string(timeout_schema) +
            R"(},"required":["command"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "write_file",
        std::string("Create or replace a file in the sandbox. Relative paths are relative to ") +
            w +
            "; "
            "parent directories are created. Put files meant for the user under " +
            a +
            ". "
            "Files persist between calls in this conversation. encoding is \"text\" (the default: "
            "content is the text) or \"base64\" (content is the exact bytes, base64-encoded); a "
            "file is at most 10 MiB.",
        R"({"type":"object","properties":{"path":{"type":"string","description":"Where to write, e.g. )" +
            jw +
            R"(/data.csv."},)"
            R"("content":{"type":"string","description":"The whole file content."},)"
            R"("encoding":{"type":"string","enum":["text","base64"],"description":"\"text\" (default) or \"base64\" (content is base64 of the bytes)."}},)"
            R"("required":["path","content"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "read_file",
        std::string("Read a file from the sandbox. Relative paths are relative to ") + w +
            ". With encoding "
            "\"text\" (the default) long files are cut to their head and tail (the result says "
            "truncated); to see a part, use " +
            p +
            "run_shell with sed -n or grep. With encoding \"base64\" the result's content is the "
            "exact bytes, base64-encoded (a file of at most 10 MiB).",
        R"({"type":"object","properties":{"path":{"type":"string","description":"The file to read."},)"
        R"("encoding":{"type":"string","enum":["text","base64"],"description":"\"text\" (default) or \"base64\" (the exact bytes)."}},)"
        R"("required":["path"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "list_files",
        "List a directory in the sandbox (name, type, size). Defaults to " + w +
            ", the working "
            "directory; files for the user belong in " +
            a + ".",
        R"({"type":"object","properties":{"path":{"type":"string","description":"Directory to list (default )" +
            jw +
            R"()."}},)"
            R"("additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "start_process",
        "Start a long-running program in the background in this conversation's sandbox, such "
        "as a server (python3 -m http.server 8000) that later " +
            p + "run_shell or " + p +
            "run_python calls talk to over 127.0.0.1. The command (/bin/sh -c) runs in cwd "
            "(default " +
            w + ") and keeps running across calls until it exits, " + p +
            "stop_process stops it, or the conversation ends. Programs that " + p +
            "run_shell leaves running are stopped when its command ends, so start services "
            "here. At most 8 run at once. The result has the process's id; read what it prints "
            "with " +
            p + "read_process_output (the last 64 KiB of stdout and of stderr are kept).",
        R"({"type":"object","properties":{"command":{"type":"string","description":"The shell command line, e.g. python3 -m http.server 8000."},)"
        R"("cwd":{"type":"string","description":"Working directory (default )" +
            jw +
            R"()."}},)"
            R"("required":["command"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "list_processes",
        "List this conversation's background processes (from " + p +
            "start_process): id, command, whether each is running, its exit code once ended, "
            "and how many bytes it has printed.",
        R"({"type":"object","properties":{},"additionalProperties":false})"});
    tools.push_back(tool_definition{
        p + "read_process_output",
        "Show what a background process (from " + p +
            "start_process) has printed so far: the last 64 KiB of its stdout and of its "
            "stderr, cut to head and tail when long, and whether it is still running.",
        std::string(process_id_schema)});
    tools.push_back(tool_definition{
        p + "stop_process",
        "Stop a background process (from " + p +
            "start_process): SIGTERM, then SIGKILL after 3 seconds. The result says how it "
            "ended.",
        std::string(process_id_schema)});
    return tools;
}

}  // namespace moat
