// Latency samples as `moat bench` reports them: percentiles over exact samples, a JSON object,
// and an SVG plot of their cumulative distributions drawn by moat itself.
#pragma once

#include "core/json_writer.hpp"

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::cli {

struct latency_samples {
    std::string name;        // "create", "baseline_create", ...
    std::vector<double> ms;  // successful samples
    std::size_t failures = 0;

    // Nearest-rank percentile (0 < q <= 1) of the successful samples; 0 when there are none.
    double percentile(double q) const;
    double mean() const;
    double success_rate() const;
};

// {"n", "failures", "success_rate", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"}
void write_summary(json_writer& w, const latency_samples& s);

// "create                     500  100.0%   1.78   2.20   3.12   3.40   3.48"
std::string summary_line(const latency_samples& s);
std::string summary_header();

// A bench's report: `text` on stdout and, when `json_path` is not empty, one JSON object there
// (its members written by `members`) and a newline. false, the error printed for `command`, when
// the file cannot be written.
bool publish_report(std::string_view command, std::string_view text, const std::string& json_path,
                    const std::function<void(json_writer&)>& members);

// A self-contained SVG with one CDF line per series (log-scaled latency axis).
std::string cdf_svg(const std::vector<const latency_samples*>& series, const std::string& title);

}  // namespace moat::cli
