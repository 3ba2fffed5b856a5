// resource_limits as a JSON object, one spelling for every place that writes it (the state
// records, the CLI's reports): {"memory_bytes", "pids", "cpu_millicores", "workspace_bytes",
// "tmp_bytes"}.
#pragma once

#include <moat/sandbox_spec.hpp>

#include "core/json_writer.hpp"

namespace moat {

inline void write_limits_json(json_writer& w, const resource_limits& limits) {
    w.begin_object();
    w.key("memory_bytes").value(limits.memory_bytes);
    w.key("pids").value(static_cast<std::uint64_t>(limits.pids));
    w.key("cpu_millicores").value(static_cast<std::uint64_t>(limits.cpu_millicores));
    w.key("workspace_bytes").value(limits.workspace_bytes);
    w.key("tmp_bytes").value(limits.tmp_bytes);
    w.end_object();
}

}  // namespace moat
