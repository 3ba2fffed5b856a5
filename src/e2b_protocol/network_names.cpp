#include "e2b_protocol/network_names.hpp"

#include "egress/network_policy.hpp"

#include <string>

namespace moat::e2b_protocol {

result<void> check_allow_out_name(std::string_view name) {
    std::string why;
    const auto pattern = egress::parse_host_pattern(name, why);
    const std::string quoted = "'" + std::string(name) + "'";
    if (!pattern) return make_error(errc::invalid_argument, quoted + " " + why);
    if (pattern->port) {
        return make_error(errc::not_supported,
                          quoted +
                              " has a port: E2B filters by domain name, HTTP and HTTPS only: "
                              "drop ':PORT'");
    }
    return {};
}

}  // namespace moat::e2b_protocol
