// The pooling advisor behind `moat bench advise`: from create latency (measured, or given for a
// remote provider), the latency budget before a model's first token, the arrival rate of new
// sessions and an optional create-rate cap, it recommends creating on demand or a warm pool, and
// the pool's size, with its reasoning. Pure: no I/O.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace moat::cli {

struct advisor_input {
    double create_p50_ms = 0;
    double create_p99_ms = 0;
    double first_token_ms = 0;              // the latency budget the create must fit into
    double arrivals_per_s = 0;              // new sessions (or per-call requests) per second
    std::optional<double> create_rate_cap;  // creates per second the backend allows
    double miss_probability = 0.01;         // acceptable chance a request finds the pool empty
    // A create may take this share of the budget before a pool is worth it.
    double budget_share = 0.10;
};

struct advice {
    bool use_pool = false;
    std::size_t pool_size = 0;
    bool cannot_keep_up = false;  // arrivals reach the create-rate cap: no pool size suffices
    std::vector<std::string> reasoning;
};

advice advise(const advisor_input& in);

// Smallest n with P(Poisson(mean) > n) <= p.
std::size_t poisson_quantile(double mean, double p);

}  // namespace moat::cli
