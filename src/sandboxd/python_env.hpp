// A sandbox's own Python environment: a virtual environment with --system-site-packages
// semantics at wire::python_env_dir (/opt/moat/python), so that `python`, `python3` and `pip` on
// PATH are one interpreter that sees the root's packages (pandas, numpy, ...) and whatever the
// sandbox's user installs. pip skips Debian's PEP 668 "externally-managed-environment" refusal
// inside a virtual environment, and installs into the environment, never into /usr.
//
// Per sandbox: pid 1 (sandbox_child.cpp) mounts a tmpfs on the environment's mount point (of the
// workspace's size, owned by the sandbox's user, charged to its memory cgroup, gone with it) and
// writes this skeleton into it as the sandbox's user:
//
//   pyvenv.cfg        home = <interpreter's directory>, include-system-site-packages = true
//   pip.conf          a short timeout, one retry, no download cache (docs/templates.md)
//   bin/python3       -> the root's interpreter (an absolute link, resolved in the sandbox)
//   bin/python, bin/python3.N   -> python3
//   bin/pip           a script running pip's main with the environment's interpreter, which
//                     adds a one-line reason when an install fails in a sandbox without network
//   bin/pip3, bin/pip3.N        -> pip
//   lib/python3.N/site-packages/   where pip installs; lib64 -> lib
//
// The texts are prepared here once per interpreter (the base root's when the helper starts, a
// template's the first time a sandbox of it is created), never per create.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace moat::sandboxd {

// What pid 1 writes, as NUL-terminated paths relative to the environment's root and texts with
// their lengths. Points into the python_env that made it, which outlives every create.
struct python_env_files {
    const char* interpreter;       // bin/python3's target, e.g. /usr/bin/python3.11
    const char* lib_dir;           // lib/python3.11
    const char* site_dir;          // lib/python3.11/site-packages
    const char* versioned_python;  // bin/python3.11
    const char* versioned_pip;     // bin/pip3.11
    const char* pyvenv_cfg;
    std::size_t pyvenv_cfg_length;
    const char* pip_conf;
    std::size_t pip_conf_length;
    const char* pip_script;
    std::size_t pip_script_length;
};

class python_env {
  public:
    // The environment of `interpreter`: an absolute, clean path whose file name is python3.N.
    // nullopt for anything else.
    static std::optional<python_env> of(std::string_view interpreter);

    python_env(const python_env&) = delete;
    python_env& operator=(const python_env&) = delete;
    python_env(python_env&& other) noexcept;
    python_env& operator=(python_env&&) = delete;

    const python_env_files& files() const noexcept { return files_; }
    const std::string& interpreter() const noexcept { return interpreter_; }

  private:
    python_env() = default;
    void point_files();

    std::string interpreter_, lib_dir_, site_dir_, versioned_python_, versioned_pip_;
    std::string pyvenv_cfg_, pip_conf_, pip_script_;
    python_env_files files_{};
};

// The interpreter of the base root's environment: the first of /usr/local/bin/python3 and
// /usr/bin/python3 (the default PATH's order) whose real path is below /usr (what the base root
// shows of the host) and named python3.N; "" when the host has none.
std::string host_python_interpreter();

// The environments a helper hands to its creates: the base root's, and one per template
// interpreter, each made once and kept (their files stay valid for the helper's life).
class python_envs {
  public:
    // Once, when the helper has built the base root.
    void init_base();
    // The base root's environment, or null when the host has no python3.
    const python_env_files* base() const noexcept;
    // A template's (`interpreter` from its record): null for "", and `valid` false for a path
    // python_env::of refuses.
    const python_env_files* for_template(std::string_view interpreter, bool& valid);

  private:
    std::optional<python_env> base_;
    std::map<std::string, python_env, std::less<>> templates_;
};

}  // namespace moat::sandboxd
