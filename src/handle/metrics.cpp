#include <moat/metrics.hpp>

#include <cstdio>
#include <limits>

namespace moat {

void latency_histogram::record(std::chrono::nanoseconds d) noexcept {
    const double ms = static_cast<double>(d.count()) / 1e6;
    std::size_t i = 0;
    while (i < bounds_ms.size() && ms > bounds_ms[i]) ++i;
    ++buckets_[i];
    ++count_;
    sum_ms_ += ms;
}

std::uint64_t latency_histogram::cumulative(std::size_t i) const noexcept {
    std::uint64_t total = 0;
    for (std::size_t b = 0; b <= i && b < buckets_.size(); ++b) total += buckets_[b];
    return total;
}

double latency_histogram::quantile_ms(double q) const noexcept {
    if (count_ == 0) return 0;
    const double rank = q * static_cast<double>(count_);
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
        seen += buckets_[i];
        if (static_cast<double>(seen) >= rank) {
            return i < bounds_ms.size() ? bounds_ms[i] : std::numeric_limits<double>::infinity();
        }
    }
    return std::numeric_limits<double>::infinity();
}

namespace {

std::string number(double v) {
    char text[64];
    std::snprintf(text, sizeof text, "%.9g", v);
    return text;
}

void histogram_text(std::string& out, const std::string& name, const std::string& labels,
                    const latency_histogram& h) {
    const std::string sep = labels.empty() ? "" : ",";
    for (std::size_t i = 0; i < latency_histogram::bounds_ms.size(); ++i) {
        out += name + "_bucket{" + labels + sep + "le=\"" +
               number(latency_histogram::bounds_ms[i] / 1000.0) + "\"} " +
               std::to_string(h.cumulative(i)) + "\n";
    }
    out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(h.count()) + "\n";
    const std::string braces = labels.empty() ? "" : "{" + labels + "}";
    out += name + "_sum" + braces + " " + number(h.sum_ms() / 1000.0) + "\n";
    out += name + "_count" + braces + " " + std::to_string(h.count()) + "\n";
}

}  // namespace

std::string to_prometheus(const runtime_metrics& m) {
    std::string out;
    out += "# HELP moat_operations_total Sandbox operations finished, by operation.\n";
    out += "# TYPE moat_operations_total counter\n";
    for (const auto& [op, n] : m.operations) {
        out += "moat_operations_total{operation=\"" + op + "\"} " + std::to_string(n) + "\n";
    }
    out += "# HELP moat_operation_failures_total Sandbox operations that failed, by operation.\n";
    out += "# TYPE moat_operation_failures_total counter\n";
    for (const auto& [op, n] : m.failures) {
        out +=
            "moat_operation_failures_total{operation=\"" + op + "\"} " + std::to_string(n) + "\n";
    }
    out += "# HELP moat_operation_duration_seconds Time an operation ran, queue time excluded.\n";
    out += "# TYPE moat_operation_duration_seconds histogram\n";
    for (const auto& [op, h] : m.latency) {
        histogram_text(out, "moat_operation_duration_seconds", "operation=\"" + op + "\"", h);
    }
    out += "# HELP moat_queue_wait_seconds Time operations waited for their sandbox's turn.\n";
    out += "# TYPE moat_queue_wait_seconds histogram\n";
    histogram_text(out, "moat_queue_wait_seconds", "", m.queue_wait);
    out += "# HELP moat_quarantines_total Handles quarantined.\n";
    out += "# TYPE moat_quarantines_total counter\n";
    out += "moat_quarantines_total " + std::to_string(m.quarantines) + "\n";
    out += "# HELP moat_admission_refused_total Creates refused by admission control.\n";
    out += "# TYPE moat_admission_refused_total counter\n";
    out += "moat_admission_refused_total " + std::to_string(m.admission_refused) + "\n";
    out += "# HELP moat_live_sandboxes Sandboxes the runtime holds.\n";
    out += "# TYPE moat_live_sandboxes gauge\n";
    out += "moat_live_sandboxes " + std::to_string(m.live_sandboxes) + "\n";
    return out;
}

}  // namespace moat
