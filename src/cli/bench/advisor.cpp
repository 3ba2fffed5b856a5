#include "cli/bench/advisor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moat::cli {
namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
    char text[256];
    std::snprintf(text, sizeof text, fmt, a, b, c);
    return text;
}

}  // namespace

std::size_t poisson_quantile(double mean, double p) {
    if (mean <= 0) return 0;
    // Sum the probability mass until the tail beyond n is at most p.
    double term = std::exp(-mean);
    double cumulative = term;
    std::size_t n = 0;
    while (1.0 - cumulative > p && n < 1'000'000) {
        ++n;
        term *= mean / static_cast<double>(n);
        cumulative += term;
    }
    return n;
}

advice advise(const advisor_input& in) {
    advice out;
    const double budget = in.first_token_ms * in.budget_share;
    out.reasoning.push_back(
        format("create takes %.2f ms at p50 and %.2f ms at p99; the first-token budget is %.0f ms.",
               in.create_p50_ms, in.create_p99_ms, in.first_token_ms));
    if (in.create_p99_ms <= budget) {
        out.reasoning.push_back(format(
            "p99 create fits in %.0f%% of the budget (%.1f ms): create on demand, per session or "
            "per call; a pool would buy nothing.",
            in.budget_share * 100, budget));
        return out;
    }
    out.use_pool = true;
    out.reasoning.push_back(format(
        "p99 create exceeds %.0f%% of the budget (%.1f ms): hand out warm sandboxes from a pool.",
        in.budget_share * 100, budget));
    // A slot taken from the pool is refilled by one create; with a rate cap, creates cannot start
    // more often than the cap allows.
    double refill_s = in.create_p99_ms / 1000.0;
    if (in.create_rate_cap && *in.create_rate_cap > 0) {
        if (in.arrivals_per_s >= *in.create_rate_cap) {
            out.cannot_keep_up = true;
            out.reasoning.push_back(
                format("arrivals (%.2f/s) reach the create-rate cap (%.2f/s): the pool drains "
                       "whatever its "
                       "size; raise the cap or accept that requests wait for creates.",
                       in.arrivals_per_s, *in.create_rate_cap));
        }
        refill_s = std::max(refill_s, 1.0 / *in.create_rate_cap);
        out.reasoning.push_back(
            format("with the cap of %.2f creates/s a slot refills in at least %.3f s.",
                   *in.create_rate_cap, refill_s));
    }
    const double in_flight = in.arrivals_per_s * refill_s;
    out.pool_size = std::max<std::size_t>(1, poisson_quantile(in_flight, in.miss_probability));
    out.reasoning.push_back(
        format("arrivals of %.2f/s over a %.3f s refill leave %.2f refills in flight on average.",
               in.arrivals_per_s, refill_s, in_flight));
    out.reasoning.push_back(
        format("a pool of %.0f keeps the chance that a request finds it empty at or below %.1f%% "
               "(Poisson arrivals).",
               static_cast<double>(out.pool_size), in.miss_probability * 100));
    return out;
}

}  // namespace moat::cli
