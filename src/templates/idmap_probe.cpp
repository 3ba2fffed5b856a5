#include "templates/idmap_probe.hpp"

#include "core/idmapped_mount.hpp"

#include <cstring>

namespace moat::templates {

result<void> probe_idmapped_mount(const std::string& dir) {
    std::string step;
    if (const int err = idmapped::probe(dir.c_str(), step)) {
        return make_error(errc::layer_unavailable,
                          step + ": " + std::strerror(err) +
                              " (templates need idmapped mounts: Linux 5.12 or later, as root, "
                              "on a file system that supports them)");
    }
    return {};
}

}  // namespace moat::templates
