#include "sandboxd/cgroups.hpp"

#include <unistd.h>

#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr std::array<std::uint32_t, controller_count> layer_bits = {
    wire::layer_cgroup_memory, wire::layer_cgroup_pids, wire::layer_cgroup_cpu};

// Before discover(): every controller unavailable.
class no_hierarchy final : public cgroup_hierarchy {
  public:
    cgroup_layout_kind layout() const override { return cgroup_layout_kind::none; }
    const std::string& unavailable_reason(controller) const override { return why_; }
    int create(std::string_view, const cgroup_limits&, sandbox_cgroups& out,
               std::string& detail) const override {
        out = {};
        detail = why_;
        return ENOENT;
    }
    int open_join(sandbox_cgroups&, cgroup_join_fds&, bool, std::string&) const override {
        return 0;
    }
    void kill(const sandbox_cgroups&) const override {}
    int try_remove(sandbox_cgroups& group) const override {
        group = {};
        return 0;
    }

  private:
    std::string why_ = "cgroups: not discovered";
};

}  // namespace

void cgroup_join_fds::close_all() {
    for (int* fd : {&init[0], &init[1], &init[2], &commands, &commands_kill}) {
        if (*fd >= 0) ::close(*fd);
        *fd = -1;
    }
}

cgroups::cgroups() : impl_(std::make_unique<no_hierarchy>()) {}
cgroups::~cgroups() = default;

void cgroups::discover() {
    const cgroup_layout layout = read_cgroup_layout();
    // Hybrid hosts keep v1 for limits: there the v2 hierarchy has no controllers to give.
    if (layout.limits_use_v1() || layout.v2_mount.empty()) {
        impl_ = make_v1_hierarchy(layout);
    } else {
        impl_ = make_v2_hierarchy(layout);
    }
}

cgroup_layout_kind cgroups::layout() const {
    return impl_->layout();
}

bool cgroups::available(controller c) const {
    return impl_->unavailable_reason(c).empty();
}

const std::string& cgroups::unavailable_reason(controller c) const {
    return impl_->unavailable_reason(c);
}

std::uint32_t cgroups::host_layers() const {
    std::uint32_t layers = 0;
    for (std::size_t i = 0; i < controller_count; ++i) {
        if (available(static_cast<controller>(i))) layers |= layer_bits[i];
    }
    return layers;
}

int cgroups::create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
                    std::string& detail) const {
    return impl_->create(sandbox_id, limits, out, detail);
}

int cgroups::open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                       std::string& detail) const {
    fds.close_all();
    return impl_->open_join(group, fds, best_effort, detail);
}

void cgroups::kill(const sandbox_cgroups& group) const {
    if (!group.empty()) impl_->kill(group);
}

int cgroups::try_remove(sandbox_cgroups& group) const {
    if (group.empty()) return 0;
    return impl_->try_remove(group);
}

}  // namespace moat::sandboxd
