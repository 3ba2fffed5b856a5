// One measured sandbox life for `moat bench`: create through the runtime (until pid 1 is ready),
// a first exec of /bin/true, destroy (until confirmed); and rounds of them.
#pragma once

#include <moat/runtime.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace moat::cli {

struct iteration_outcome {
    bool done = false;
    bool ok = false;
    double create_ms = 0, exec_ms = 0, destroy_ms = 0;
};

// Waits `delay`, then measures one create / exec / destroy into `out`, of a sandbox of
// `template_name` ("": the backend's default root).
asio::awaitable<void> one_iteration(runtime& sandboxes, std::chrono::milliseconds delay,
                                    std::shared_ptr<iteration_outcome> out,
                                    std::string template_name = {});

// Starts `count` iterations (the i-th after i * `spacing`) and waits for all of them.
asio::awaitable<std::vector<std::shared_ptr<iteration_outcome>>> run_round(
    runtime& sandboxes, std::size_t count, std::chrono::milliseconds spacing);

// Admission opened up for a bench of `n` iterations, `concurrency` at a time.
runtime_options bench_runtime_options(std::size_t n, std::size_t concurrency);

}  // namespace moat::cli
