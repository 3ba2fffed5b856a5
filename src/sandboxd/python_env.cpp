#include "sandboxd/python_env.hpp"

#include "wire/protocol.hpp"

#include <climits>
#include <cstdlib>
#include <utility>

namespace moat::sandboxd {
namespace {

bool clean_absolute(std::string_view path) {
    return path.size() > 1 && path.front() == '/' && path.find("/..") == std::string_view::npos &&
           path.find("/./") == std::string_view::npos &&
           path.find("//") == std::string_view::npos && path.size() < wire::path_bytes;
}

// pip's "site" configuration ($VIRTUAL_ENV/pip.conf): a refused connection (no network, a host
// off the allow-list, which the proxy answers 403) fails after one retry instead of five with
// backoff; no cache in $HOME, which is the workspace by default.
constexpr std::string_view pip_conf_text =
    "# moat: this sandbox's Python environment (docs/templates.md, \"Python in a sandbox\")\n"
    "[global]\n"
    "timeout = 15\n"
    "retries = 1\n"
    "no-cache-dir = true\n"
    "disable-pip-version-check = true\n";

// moat forces HTTP_PROXY and HTTPS_PROXY on every command of a sandbox with a network, and sets
// none without one: their absence is the sandbox's "no network".
constexpr std::string_view pip_script_body =
    "# moat: pip of this sandbox's Python environment, which it installs into\n"
    "import os, sys\n"
    "try:\n"
    "    from pip._internal.cli.main import main\n"
    "except ImportError:\n"
    "    sys.exit('pip is not installed for ' + sys.executable)\n"
    "status = main()\n"
    "if status and not os.environ.get('HTTPS_PROXY') and \\\n"
    "        {'install', 'download', 'wheel', 'index'} & set(sys.argv[1:]):\n"
    "    sys.stderr.write('moat: this sandbox has no network access, so pip can install only '\n"
    "                     'from local files (pip install ./package.whl)\\n')\n"
    "sys.exit(status)\n";

}  // namespace

std::optional<python_env> python_env::of(std::string_view interpreter) {
    const std::string version(wire::python_version(interpreter));
    if (version.empty() || !clean_absolute(interpreter)) return std::nullopt;
    python_env env;
    env.interpreter_ = interpreter;
    env.lib_dir_ = "lib/python" + version;
    env.site_dir_ = env.lib_dir_ + "/site-packages";
    env.versioned_python_ = "bin/python" + version;
    env.versioned_pip_ = "bin/pip" + version;
    const std::string home(interpreter.substr(0, interpreter.rfind('/')));
    env.pyvenv_cfg_ = "home = " + (home.empty() ? std::string("/") : home) +
                      "\ninclude-system-site-packages = true\nversion = " + version + "\n";
    env.pip_conf_ = pip_conf_text;
    env.pip_script_ = "#!" + std::string(wire::python_env_dir) + "/bin/python3\n";
    env.pip_script_ += pip_script_body;
    env.point_files();
    return env;
}

python_env::python_env(python_env&& other) noexcept
    : interpreter_(std::move(other.interpreter_)),
      lib_dir_(std::move(other.lib_dir_)),
      site_dir_(std::move(other.site_dir_)),
      versioned_python_(std::move(other.versioned_python_)),
      versioned_pip_(std::move(other.versioned_pip_)),
      pyvenv_cfg_(std::move(other.pyvenv_cfg_)),
      pip_conf_(std::move(other.pip_conf_)),
      pip_script_(std::move(other.pip_script_)) {
    point_files();  // a short string's characters move with it
}

void python_env::point_files() {
    files_.interpreter = interpreter_.c_str();
    files_.lib_dir = lib_dir_.c_str();
    files_.site_dir = site_dir_.c_str();
    files_.versioned_python = versioned_python_.c_str();
    files_.versioned_pip = versioned_pip_.c_str();
    files_.pyvenv_cfg = pyvenv_cfg_.c_str();
    files_.pyvenv_cfg_length = pyvenv_cfg_.size();
    files_.pip_conf = pip_conf_.c_str();
    files_.pip_conf_length = pip_conf_.size();
    files_.pip_script = pip_script_.c_str();
    files_.pip_script_length = pip_script_.size();
}

std::string host_python_interpreter() {
    for (const char* candidate : {"/usr/local/bin/python3", "/usr/bin/python3"}) {
        char real[PATH_MAX];
        if (::realpath(candidate, real) == nullptr) continue;
        const std::string_view path = real;
        // Anything outside /usr (a pyenv under /root) is not in the base root.
        if (!path.starts_with("/usr/") || wire::python_version(path).empty()) continue;
        return std::string(path);
    }
    return {};
}

void python_envs::init_base() {
    if (auto env = python_env::of(host_python_interpreter())) base_.emplace(std::move(*env));
}

const python_env_files* python_envs::base() const noexcept {
    return base_ ? &base_->files() : nullptr;
}

const python_env_files* python_envs::for_template(std::string_view interpreter, bool& valid) {
    valid = true;
    if (interpreter.empty()) return nullptr;
    if (const auto found = templates_.find(interpreter); found != templates_.end())
        return &found->second.files();
    auto made = python_env::of(interpreter);
    if (!made) {
        valid = false;
        return nullptr;
    }
    auto [at, inserted] = templates_.emplace(std::string(interpreter), std::move(*made));
    return &at->second.files();
}

}  // namespace moat::sandboxd
