// The baselines `moat bench` runs round-robin with moat, so background load falls on both alike:
// the raw isolation program (bench/raw_isolation.cpp), bwrap with comparable flags, and a host
// posix_spawn of the same command. All blocking; each call is one sample.
#pragma once

#include <sys/types.h>
#include <memory>
#include <optional>
#include <string>

namespace moat::cli {

// Drives a moat-bench-raw process over its stdin/stdout.
class raw_baseline {
  public:
    // Starts `path` with `state_dir`; null (with `why`) if it cannot run here.
    static std::unique_ptr<raw_baseline> start(const std::string& path,
                                               const std::string& state_dir, std::string& why);
    raw_baseline(const raw_baseline&) = delete;
    raw_baseline& operator=(const raw_baseline&) = delete;
    ~raw_baseline();

    struct sample {
        double create_ms = 0, exec_ms = 0, destroy_ms = 0;
    };
    // One create / exec / destroy; nullopt with `why` on failure (bounded: 30 s).
    std::optional<sample> run(std::string& why);

  private:
    raw_baseline() = default;
    pid_t pid_ = -1;
    int to_ = -1;
    int from_ = -1;
};

// Where moat-bench-raw is: `hint` if set, else beside this executable (bench/ of a build tree,
// or libexec/moat of an install). "" if not found.
std::string find_raw_baseline(const std::string& hint);

// bwrap's path on this host, or "".
std::string find_bwrap();

// One bwrap sandbox running /bin/true from start to exit, in ms; nullopt if it failed.
std::optional<double> bwrap_run_true(const std::string& bwrap);

// A host posix_spawn + wait of /bin/true, in ms.
double host_spawn_true();

}  // namespace moat::cli
