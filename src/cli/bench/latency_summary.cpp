#include "cli/bench/latency_summary.hpp"

#include "cli/cli_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

namespace moat::cli {

double latency_samples::percentile(double q) const {
    if (ms.empty()) return 0;
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

double latency_samples::mean() const {
    if (ms.empty()) return 0;
    return std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
}

double latency_samples::success_rate() const {
    const std::size_t total = ms.size() + failures;
    return total == 0 ? 0 : static_cast<double>(ms.size()) / static_cast<double>(total);
}

void write_summary(json_writer& w, const latency_samples& s) {
    w.begin_object();
    w.key("n").value(static_cast<std::uint64_t>(s.ms.size() + s.failures));
    w.key("failures").value(static_cast<std::uint64_t>(s.failures));
    w.key("success_rate").value(s.success_rate());
    w.key("mean_ms").value(s.mean());
    w.key("p50_ms").value(s.percentile(0.5));
    w.key("p90_ms").value(s.percentile(0.9));
    w.key("p99_ms").value(s.percentile(0.99));
    w.key("p999_ms").value(s.percentile(0.999));
    w.key("max_ms").value(s.percentile(1.0));
    w.end_object();
}

std::string summary_header() {
    char line[160];
    std::snprintf(line, sizeof line, "%-22s %6s %7s %8s %8s %8s %8s %8s\n", "(ms)", "n", "ok",
                  "p50", "p90", "p99", "p999", "max");
    return line;
}

std::string summary_line(const latency_samples& s) {
    char line[160];
    std::snprintf(line, sizeof line, "%-22s %6zu %6.1f%% %8.2f %8.2f %8.2f %8.2f %8.2f\n",
                  s.name.c_str(), s.ms.size() + s.failures, 100.0 * s.success_rate(),
                  s.percentile(0.5), s.percentile(0.9), s.percentile(0.99), s.percentile(0.999),
                  s.percentile(1.0));
    return line;
}

std::string cdf_svg(const std::vector<const latency_samples*>& series, const std::string& title) {
    constexpr double width = 720, height = 420, left = 60, right = 20, top = 40, bottom = 50;
    double lo = 1e9, hi = 0;
    for (const auto* s : series) {
        for (const double v : s->ms) {
            lo = std::min(lo, std::max(v, 0.01));
            hi = std::max(hi, v);
        }
    }
    if (hi <= 0) {
        lo = 0.1;
        hi = 1;
    }
    const double log_lo = std::floor(std::log10(lo)), log_hi = std::ceil(std::log10(hi));
    const double span = std::max(log_hi - log_lo, 1.0);
    const auto x_of = [&](double ms) {
        return left + (std::log10(std::max(ms, 0.01)) - log_lo) / span * (width - left - right);
    };
    const auto y_of = [&](double q) { return top + (1 - q) * (height - top - bottom); };
    static constexpr const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c",
                                             "#9467bd", "#ff7f0e", "#8c564b"};
    std::string svg;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n",
                  width, height);
    svg += buf;
    svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">", left);
    svg += buf;
    svg += title + "</text>\n";
    // Axes, decades and quartiles.
    for (double d = log_lo; d <= log_hi; d += 1) {
        const double x = left + (d - log_lo) / span * (width - left - right);
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g ms</text>\n",
                      x, top, x, height - bottom, x, height - bottom + 16, std::pow(10.0, d));
        svg += buf;
    }
    for (const double q : {0.0, 0.5, 0.9, 0.99, 1.0}) {
        std::snprintf(buf, sizeof buf,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">p%g</text>\n",
                      left, y_of(q), width - right, y_of(q), left - 6, y_of(q) + 4, q * 100);
        svg += buf;
    }
    std::size_t color = 0;
    for (const auto* s : series) {
        if (s->ms.empty()) continue;
        std::vector<double> sorted = s->ms;
        std::sort(sorted.begin(), sorted.end());
        std::string points;
        for (std::size_t i = 0; i < sorted.size(); ++i) {
            const double q = static_cast<double>(i + 1) / static_cast<double>(sorted.size());
            std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(sorted[i]), y_of(q));
            points += buf;
        }
        const char* c = colors[color % std::size(colors)];
        svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(c) +
               "\" points=\"" + points + "\"/>\n";
        std::snprintf(buf, sizeof buf,
                      "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s (p50 %.2f, p99 %.2f ms)</text>\n",
                      left + 10, top + 16 + 16 * static_cast<double>(color), c, s->name.c_str(),
                      s->percentile(0.5), s->percentile(0.99));
        svg += buf;
        ++color;
    }
    svg += "</svg>\n";
    return svg;
}

bool publish_report(std::string_view command, std::string_view text, const std::string& json_path,
                    const std::function<void(json_writer&)>& members) {
    write_all(STDOUT_FILENO, text);
    if (json_path.empty()) return true;
    json_writer w;
    w.begin_object();
    members(w);
    w.end_object();
    std::ofstream file(json_path);
    file << w.take() << "\n";
    if (file) return true;
    report_error(command, make_error(errc::invalid_argument, "cannot write " + json_path));
    return false;
}

}  // namespace moat::cli
