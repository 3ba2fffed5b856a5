// What every part of `moat serve` shares: the executor, the runtime that creates and attaches
// sandboxes, the registry of this server's sandboxes, the options, and a task group for work
// that outlives a request (a background process's output pump). Owned by serve_host, which
// outlives both HTTP servers and everything they run. Confined to the executor.
#pragma once

#include <moat/runtime.hpp>
#include <moat/task_group.hpp>

#include "handle/operation_queue.hpp"
#include "serve/sandbox_registry.hpp"
#include "serve/serve_options.hpp"

#include <asio/any_io_executor.hpp>

#include <memory>

namespace moat::serve {

struct serve_context {
    asio::any_io_executor executor;
    runtime& sandboxes;
    sandbox_registry& registry;
    const serve_options& options;
    // Cancelled (terminal) and awaited when the server stops, after both listeners have closed.
    task_group& background;
    // The server-wide turns of envd's directory listings (envd_filesystem.cpp), made on first use.
    std::shared_ptr<operation_queue> listings = nullptr;
};

}  // namespace moat::serve
