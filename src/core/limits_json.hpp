// resource_limits as a JSON object, one spelling for every place that writes it (the state
// records, the CLI's reports): {"memory_bytes", "pids", "cpu_millicores", "workspace_bytes",
// "tmp_bytes", "open_files"}, each an integer; an unset limit is left out.
#pragma once

#include <moat/sandbox_spec.hpp>

#include <cstdint>
#include <optional>

#include "core/json_writer.hpp"

namespace moat {

template <class Int>
inline void write_limit_json(json_writer& w, const char* key, const std::optional<Int>& value) {
    if (value) w.key(key).value(static_cast<std::uint64_t>(*value));
}

inline void write_limits_json(json_writer& w, const resource_limits& limits) {
    w.begin_object();
    write_limit_json(w, "memory_bytes", limits.memory_bytes);
    write_limit_json(w, "pids", limits.pids);
    write_limit_json(w, "cpu_millicores", limits.cpu_millicores);
    write_limit_json(w, "workspace_bytes", limits.workspace_bytes);
    write_limit_json(w, "tmp_bytes", limits.tmp_bytes);
    write_limit_json(w, "open_files", limits.open_files);
    w.end_object();
}

}  // namespace moat
