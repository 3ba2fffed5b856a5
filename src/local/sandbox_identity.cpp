// The calling thread's switch to a sandbox user's filesystem identity and back (the contract is
// in sandbox_identity.hpp), and the process-wide dumpable flag that switch must keep.
#include "local/sandbox_identity.hpp"

#include <moat/log.hpp>

#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace moat {
namespace {

// The process's dumpable flag belongs to its memory map, shared by every thread, and the kernel
// resets it (to fs.suid_dumpable, usually 0) whenever any thread changes its fsuid: left reset, the
// application would lose its core dumps and its /proc files would turn root-owned. Threads that
// switch identity at the same time therefore share one saved value: the first to switch saves it,
// the last to switch back restores it, both under one lock. (Restoring per thread raced: a second
// thread could save the already-reset flag and restore that last.)
class dumpable_keeper {
  public:
    // Before this thread's first credential change; false if the flag cannot be read.
    bool enter() {
        const std::lock_guard lock(mutex_);
        if (holders_ == 0) {
            saved_ = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
            if (saved_ < 0) return false;
        }
        ++holders_;
        return true;
    }

    // After this thread has its credentials back; false if the flag could not be restored.
    bool leave() {
        const std::lock_guard lock(mutex_);
        if (--holders_ != 0) return true;
        return ::prctl(PR_SET_DUMPABLE, saved_, 0, 0, 0) == 0;
    }

  private:
    std::mutex mutex_;
    int holders_ = 0;
    int saved_ = 1;
};

dumpable_keeper& process_dumpable() {
    static dumpable_keeper keeper;
    return keeper;
}

}  // namespace

sandbox_identity::~sandbox_identity() {
    if (!changed_) {
        if (entered_ && !process_dumpable().leave()) abort_unrestored();
        return;
    }
    // The capabilities first (setgroups needs CAP_SETGID), and again last: going back to fsuid
    // 0 makes the kernel add the filesystem capabilities of the permitted set, which the
    // application may have kept out of its effective set.
    bool restored = ::syscall(SYS_capset, &header_, saved_caps_) == 0;
    restored =
        restored && ::syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data()) == 0;
    ::syscall(SYS_setfsgid, saved_gid_);
    ::syscall(SYS_setfsuid, saved_uid_);
    restored = restored && static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) == saved_uid_ &&
               static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) == saved_gid_;
    restored = restored && ::syscall(SYS_capset, &header_, saved_caps_) == 0;
    // A change of fsuid also resets state the application may rely on: this thread's
    // parent-death signal, and the process's dumpable flag (see dumpable_keeper).
    restored = restored && ::prctl(PR_SET_PDEATHSIG, saved_pdeath_signal_, 0, 0, 0) == 0;
    restored = process_dumpable().leave() && restored;
    if (!restored) abort_unrestored();
}

result<void> sandbox_identity::status() const {
    if (switched_) return {};
    return make_error(errc::backend_failure,
                      "cannot take the sandbox user's identity for file access (" + failed_ + ": " +
                          std::strerror(errno_) + ")");
}

void sandbox_identity::abort_unrestored() {
    detail::log(log_level::error, "local",
                "cannot restore the thread's credentials after a sandbox file operation");
    std::abort();
}

bool sandbox_identity::switch_to(uid_t uid, gid_t gid) {
    saved_uid_ = static_cast<uid_t>(::syscall(SYS_setfsuid, -1));
    saved_gid_ = static_cast<gid_t>(::syscall(SYS_setfsgid, -1));
    const long groups = ::syscall(SYS_getgroups, 0, nullptr);
    if (groups < 0) return fail("getgroups");
    saved_groups_.resize(static_cast<std::size_t>(groups));
    if (::syscall(SYS_getgroups, groups, saved_groups_.data()) != groups) return fail("getgroups");
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    if (::syscall(SYS_capget, &header_, saved_caps_) != 0) return fail("capget");
    if (::prctl(PR_GET_PDEATHSIG, &saved_pdeath_signal_, 0, 0, 0) != 0) {
        return fail("PR_GET_PDEATHSIG");
    }
    if (!process_dumpable().enter()) return fail("PR_GET_DUMPABLE");
    entered_ = true;

    // Nothing has changed until setgroups succeeds: a failure here needs no undoing.
    if (::syscall(SYS_setgroups, 0, nullptr) != 0) return fail("setgroups");
    changed_ = true;
    ::syscall(SYS_setfsgid, gid);
    ::syscall(SYS_setfsuid, uid);
    // setfs*id reports no errors: read the ids back.
    if (static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) != uid ||
        static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) != gid) {
        errno = EPERM;
        return fail("setfsuid");
    }
    __user_cap_data_struct none[2];
    std::memcpy(none, saved_caps_, sizeof none);
    none[0].effective = none[1].effective = 0;
    if (::syscall(SYS_capset, &header_, none) != 0) return fail("capset");
    return true;
}

bool sandbox_identity::fail(const char* step) {
    failed_ = step;
    errno_ = errno;
    return false;
}

}  // namespace moat
