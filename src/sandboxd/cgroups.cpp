#include "sandboxd/cgroups.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

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
    int delegate(sandbox_cgroups&, uid_t, std::string&) const override { return 0; }
    void kill(const sandbox_cgroups&) const override {}
    int try_remove(sandbox_cgroups& group) const override {
        group = {};
        return 0;
    }

  private:
    std::string why_ = "cgroups: not discovered";
};

// The hybrid host's tracking tree, as the v2 code sees a sandbox's cgroups.
// <freezer mount><own>/moat, made if missing, or "" where there is no usable v1 freezer.
std::string make_freezer_parent(const cgroup_layout& layout) {
    if (layout.freezer.mount_point.empty() || !layout.freezer.listed) return "";
    std::string parent = layout.freezer.mount_point + layout.freezer.own + "/moat";
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) return "";
    return parent;
}

// rmdir of {commands, top}: 0, or the first errno (EBUSY while a process is in it).
int remove_freezer(const std::vector<std::string>& dirs) {
    int first = 0;
    for (const auto& dir : dirs) {
        if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) continue;
        if (first == 0) first = errno;
    }
    return first;
}

// The sandbox's {commands, top} in the freezer, or empty when they cannot be made (a leftover
// of a crashed helper is removed first).
std::vector<std::string> make_freezer(const std::string& parent, std::string_view sandbox_id) {
    const std::string top = parent + "/" + std::string(sandbox_id);
    std::vector<std::string> dirs = {top + "/commands", top};
    (void)remove_freezer(dirs);
    if (::mkdir(top.c_str(), 0755) != 0) return {};
    if (::mkdir(dirs[0].c_str(), 0755) != 0) {
        ::rmdir(top.c_str());
        return {};
    }
    return dirs;
}

// Thaws the commands, so that processes killed while frozen die.
void thaw(const std::vector<std::string>& dirs) {
    if (!dirs.empty()) (void)write_small_file(dirs.front() + "/freezer.state", "THAWED");
}

sandbox_cgroups tracking_view(const sandbox_cgroups& group) {
    sandbox_cgroups view;
    view.dirs = group.tracking_dirs;
    view.unified = !view.dirs.empty();
    return view;
}

}  // namespace

void cgroup_join_fds::close_all() {
    for (int* fd :
         {&init[0], &init[1], &init[2], &unified_before_namespace, &unified_after_namespace,
          &unified_dir, &commands_dir, &commands_kill, &freezer_commands, &freezer_state}) {
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
        // Per-command tracking in the unified hierarchy, where there is one.
        if (!layout.v2_mount.empty()) tracker_ = make_v2_tracker(layout);
        // Without one, the v1 freezer is where pause freezes the commands.
        if (layout.v2_mount.empty()) freezer_parent_ = make_freezer_parent(layout);
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
    if (const int err = impl_->create(sandbox_id, limits, out, detail)) return err;
    if (tracker_) {
        // Tracking is never a reason to fail: without it the agent falls back to killing strays
        // when idle.
        sandbox_cgroups tracking;
        std::string ignored;
        if (tracker_->create(sandbox_id, cgroup_limits{}, tracking, ignored) == 0) {
            out.tracking_dirs = std::move(tracking.dirs);
        }
    }
    if (!freezer_parent_.empty()) out.freezer_dirs = make_freezer(freezer_parent_, sandbox_id);
    return 0;
}

int cgroups::open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                       std::string& detail) const {
    fds.close_all();
    if (const int err = impl_->open_join(group, fds, best_effort, detail)) return err;
    if (tracker_ && !group.tracking_dirs.empty()) {
        sandbox_cgroups view = tracking_view(group);
        std::string ignored;
        (void)tracker_->open_join(view, fds, true, ignored);
        group.tracking_dirs = std::move(view.dirs);  // emptied if it could not be joined
    }
    if (!group.freezer_dirs.empty()) {
        const std::string tasks = group.freezer_dirs.front() + "/tasks";
        const std::string state = group.freezer_dirs.front() + "/freezer.state";
        fds.freezer_commands = ::open(tasks.c_str(), O_WRONLY | O_CLOEXEC);
        fds.freezer_state = ::open(state.c_str(), O_WRONLY | O_CLOEXEC);
        // Not fatal: the sandbox runs without pause.
        if (fds.freezer_commands < 0 || fds.freezer_state < 0) {
            for (int* fd : {&fds.freezer_commands, &fds.freezer_state}) {
                if (*fd >= 0) ::close(*fd);
                *fd = -1;
            }
            if (remove_freezer(group.freezer_dirs) == 0) group.freezer_dirs.clear();
        }
    }
    return 0;
}

int cgroups::delegate(sandbox_cgroups& group, uid_t owner, std::string& detail) const {
    if (const int err = impl_->delegate(group, owner, detail)) return err;
    if (tracker_ && !group.tracking_dirs.empty()) {
        sandbox_cgroups view = tracking_view(group);
        std::string ignored;
        // Not fatal: the agent finds it cannot make cgroups and falls back.
        (void)tracker_->delegate(view, owner, ignored);
    }
    return 0;
}

void cgroups::kill(const sandbox_cgroups& group) const {
    if (!group.dirs.empty()) impl_->kill(group);
    if (tracker_ && !group.tracking_dirs.empty()) tracker_->kill(tracking_view(group));
    thaw(group.freezer_dirs);
}

int cgroups::try_remove(sandbox_cgroups& group) const {
    if (group.empty()) return 0;
    int err = 0;
    if (!group.dirs.empty()) {
        std::vector<std::string> tracking = std::move(group.tracking_dirs);
        std::vector<std::string> freezer = std::move(group.freezer_dirs);
        err = impl_->try_remove(group);  // clears `group` on success
        group.tracking_dirs = std::move(tracking);
        group.freezer_dirs = std::move(freezer);
    }
    if (!group.freezer_dirs.empty()) {
        thaw(group.freezer_dirs);
        const int freezer_err = remove_freezer(group.freezer_dirs);
        if (freezer_err == 0) group.freezer_dirs.clear();
        if (err == 0) err = freezer_err;
    }
    if (tracker_ && !group.tracking_dirs.empty()) {
        sandbox_cgroups view = tracking_view(group);
        const int tracking_err = tracker_->try_remove(view);
        if (tracking_err == 0) group.tracking_dirs.clear();
        if (err == 0) err = tracking_err;
    } else {
        group.tracking_dirs.clear();
    }
    return err;
}

}  // namespace moat::sandboxd
