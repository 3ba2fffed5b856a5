// A command child of the agent (pid 1, agent.cpp), as pid 1 prepares it: its start block (the
// stack it runs on, its arguments and copies of the request's strings) and its entry point, from
// the clone to execve of the command.
#pragma once

#include <cstddef>

#include "wire/protocol.hpp"

namespace moat::sandboxd {

// What a command child reads. With clone3_run the child shares pid 1's memory (CLONE_VM) but pid 1
// does not wait for it (no CLONE_VFORK): nothing the child meets before exec (sandbox code can
// SIGSTOP it once it has the sandbox's uid) can stall pid 1, and pid 1 copies no page tables and
// takes no copy-on-write faults afterwards. So the child makes only raw system calls (errno is
// pid 1's), writes nothing of pid 1's (not `environ`: it searches PATH itself), and reads only
// its start block: the stack it runs on, this struct and copies of the request's strings, one
// mapping pid 1 keeps until the child has exec'd or died (command::block).
struct command_args {
    int stdio[3];
    int status_pipe;   // close-on-exec write end: the errno if the child fails, EOF once it execs
    int join_procs;    // without CLONE_INTO_CGROUP: a cgroup.procs to move into first, or -1
    int join_freezer;  // v1 freezer: the commands' tasks to move into first (pause), or -1
    bool terminal;     // stdio is a terminal's slave: it becomes the controlling terminal
    bool as_root;      // wire::exec_as_root: stays uid 0, takes gid 0, keeps the bounding set
    const char* cwd;
    char* const* argv;
    std::size_t argc;
    char* const* envp;
    const char* path;   // the value of the request's PATH, or null
    char** shell_argv;  // room for argc + 2 pointers: a script the kernel cannot run, see exec_file
};

// The child's entry points: command_main with the child's command_args (a forked copy of pid 1
// calls it directly), command_child for clone3_run (its argument is the command_args). Neither
// returns: the command runs, or the child reports the errno on its status pipe and exits 127.
[[noreturn]] void command_main(const command_args& a);
int command_child(void* args);

// The mapping a command child runs on and reads (command_args): a guard page, the stack, then the
// arguments and the request's strings, copied out of the receive buffer pid 1 reuses.
constexpr std::size_t child_stack_bytes = 64 * 1024;

struct start_block {
    void* base = nullptr;
    std::size_t bytes = 0;
    command_args* args = nullptr;
};

// Start blocks, a few kept for reuse: most requests fit the usual size, and a kept block has its
// guard and its touched pages already (no mmap, mprotect, page faults or munmap per exec).
class start_blocks {
  public:
    // Lays out a start block for `request`; false with errno set if there is no memory for it.
    bool make(const wire::exec_request_view& request, start_block& out);
    // The child that used it has exec'd or died (base is null afterwards).
    void release(void*& base, std::size_t bytes);

  private:
    static constexpr std::size_t usual_bytes = 4096 + child_stack_bytes + 64 * 1024;
    static constexpr std::size_t kept = 2;
    void* spare_[kept] = {};
    std::size_t spares_ = 0;
};

}  // namespace moat::sandboxd
