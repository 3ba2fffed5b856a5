// What a runtime and its handles share for metrics and operation events (metrics.hpp).
#pragma once

#include <moat/metrics.hpp>

#include <functional>

namespace moat {

struct telemetry {
    runtime_metrics metrics;
    std::uint64_t next_operation_id = 1;
    std::function<void(const operation_event&)> sink;

    void record(const operation_event& e) {
        ++metrics.operations[e.operation];
        if (e.error) ++metrics.failures[e.operation];
        metrics.latency[e.operation].record(e.ran);
        if (sink) sink(e);
    }
};

}  // namespace moat
