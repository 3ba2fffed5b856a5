// The sandbox user's filesystem identity, taken by the calling thread for a host-side file
// operation on a sandbox (sandbox_files.cpp) and given back when it ends.
#pragma once

#include <moat/result.hpp>

#include <linux/capability.h>
#include <sys/types.h>
#include <string>
#include <vector>

namespace moat {

// The calling thread takes the sandbox user's filesystem identity for its lifetime: fsuid and
// fsgid, no supplementary groups (the application's, root's group 0 included, would grant group
// access), and an empty effective capability set (CAP_SYS_PTRACE, for one, would open the /proc
// files of the sandbox's root-owned agent). Raw system calls: credentials are per thread in the
// kernel, and glibc's set*id wrappers would apply them to every thread of the application.
// The destructor restores everything; a thread that cannot get its identity back aborts, since
// the application's next file access would run with the wrong one.
class sandbox_identity {
  public:
    sandbox_identity(uid_t uid, gid_t gid) { switched_ = switch_to(uid, gid); }
    ~sandbox_identity();

    sandbox_identity(const sandbox_identity&) = delete;
    sandbox_identity& operator=(const sandbox_identity&) = delete;

    // Empty once the identity is the sandbox user's.
    result<void> status() const;

  private:
    [[noreturn]] static void abort_unrestored();
    bool switch_to(uid_t uid, gid_t gid);
    bool fail(const char* step);

    uid_t saved_uid_ = 0;
    gid_t saved_gid_ = 0;
    int saved_pdeath_signal_ = 0;
    std::vector<gid_t> saved_groups_;
    __user_cap_header_struct header_{};
    __user_cap_data_struct saved_caps_[2]{};
    bool entered_ = false;  // holds a share of process_dumpable()
    bool changed_ = false;
    bool switched_ = false;
    std::string failed_;
    int errno_ = 0;
};

}  // namespace moat
