#include <moat/tools.hpp>

namespace moat {

namespace {

// The descriptions are prompts: a model decides from them when to call a tool and what to expect.
std::vector<tool_definition> make_definitions() {
    std::vector<tool_definition> tools;
    tools.push_back(tool_definition{
        "run_python",
        "Run Python 3 code in this conversation's sandbox, like a notebook cell. State persists "
        "between calls: variables, imports and functions defined in one call are available in "
        "the next, and files stay in /workspace (the working directory). Only what the code "
        "prints is visible to you (print() it); the value of a final expression is shown too. "
        "Long output is cut to its head and tail, so print summaries (len(), df.head(), a "
        "slice) rather than whole datasets. Save files meant for the user under /workspace/out "
        "(they are listed in the result as artifacts). The network is off: no pip install, no "
        "downloads; use the standard library and what is already installed. A call that runs "
        "past timeout_seconds is stopped and the interpreter restarts, losing variables.",
        R"({"type":"object","properties":{"code":{"type":"string","description":"Python source to run."},)"
        R"("timeout_seconds":{"type":"number","exclusiveMinimum":0,"maximum":600,)"
        R"("description":"Time limit for this call (default 30)."}},"required":["code"],)"
        R"("additionalProperties":false})"});
    tools.push_back(tool_definition{
        "run_shell",
        "Run a shell command (/bin/sh -c) in this conversation's sandbox, in /workspace. Files "
        "persist between calls; shell variables and `cd` do not (each call is a new shell). "
        "Use it for file inspection (ls, head, wc, grep), running scripts and standard Unix "
        "tools. Only stdout and stderr are visible to you; long output is cut to its head and "
        "tail. Save files meant for the user under /workspace/out. The network is off and you "
        "are an unprivileged user: no package installs, no sudo.",
        R"({"type":"object","properties":{"command":{"type":"string","description":"The shell command line."},)"
        R"("timeout_seconds":{"type":"number","exclusiveMinimum":0,"maximum":600,)"
        R"("description":"Time limit for this call (default 30)."}},"required":["command"],)"
        R"("additionalProperties":false})"});
    tools.push_back(tool_definition{
        "write_file",
        "Create or replace a text file in the sandbox. Relative paths are relative to "
        "/workspace; parent directories are created. Put files meant for the user under "
        "/workspace/out. Files persist between calls in this conversation.",
        R"({"type":"object","properties":{"path":{"type":"string","description":"Where to write, e.g. /workspace/data.csv."},)"
        R"("content":{"type":"string","description":"The whole file content."}},)"
        R"("required":["path","content"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        "read_file",
        "Read a text file from the sandbox. Relative paths are relative to /workspace. Long files "
        "are cut to their head and tail; to see a part, use run_shell with sed -n or grep.",
        R"({"type":"object","properties":{"path":{"type":"string","description":"The file to read."}},)"
        R"("required":["path"],"additionalProperties":false})"});
    tools.push_back(tool_definition{
        "list_files",
        "List a directory in the sandbox (name, type, size). Defaults to /workspace, the working "
        "directory; files for the user belong in /workspace/out.",
        R"({"type":"object","properties":{"path":{"type":"string","description":"Directory to list (default /workspace)."}},)"
        R"("additionalProperties":false})"});
    return tools;
}

}  // namespace

const std::vector<tool_definition>& tool_definitions() {
    static const std::vector<tool_definition> tools = make_definitions();
    return tools;
}

}  // namespace moat
