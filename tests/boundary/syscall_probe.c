// Attempts each syscall family the sandbox denies, with arguments the kernel itself would refuse
// with an errno other than EPERM (or accept harmlessly) before any privilege check, and prints
// "name=ok" or "name=ERRNO" per line, then "done". Run by tests/local_boundary_test.cpp on the host
// without and with the filter, and inside a sandbox.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char* name, long rc) {
    printf("%s=%s\n", name, rc >= 0 ? "ok" : strerrorname_np(errno));
    fflush(stdout);
}
#define P(name, ...) report(name, syscall(__VA_ARGS__))
static char* const bad = (char*)8;

int main(void) {
    P("ptrace", SYS_ptrace, 16 /* PTRACE_ATTACH */, 0x3ffffff0, 0, 0);
    P("keyctl", SYS_keyctl, 0x7fff, 0, 0, 0, 0);
    P("add_key", SYS_add_key, NULL, NULL, NULL, 0, 0);
    P("request_key", SYS_request_key, NULL, NULL, NULL, 0);
    P("bpf", SYS_bpf, 0, bad, 64);
    P("io_uring_setup", SYS_io_uring_setup, 1, NULL);
    P("userfaultfd", SYS_userfaultfd, 1 /* UFFD_USER_MODE_ONLY */ | O_CLOEXEC);
    P("perf_event_open", SYS_perf_event_open, NULL, 0, -1, -1, ~0ul);
    P("mount", SYS_mount, "none", "/", bad, 0, NULL);
    P("umount2", SYS_umount2, "/", ~0);
    P("pivot_root", SYS_pivot_root, bad, bad);
    P("fsopen", SYS_fsopen, bad, 0);
    P("fsmount", SYS_fsmount, -1, 0, 0);
    P("fsconfig", SYS_fsconfig, -1, 0, NULL, NULL, 0);
    P("fspick", SYS_fspick, -1, "", ~0);
    P("move_mount", SYS_move_mount, -1, "", -1, "", ~0);
    P("open_tree", SYS_open_tree, AT_FDCWD, "/", O_CLOEXEC);
    P("mount_setattr", SYS_mount_setattr, -1, "", ~0, NULL, 0);
    P("unshare", SYS_unshare, 0);
    P("setns", SYS_setns, -1, 0);
    long child = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (child == 0) _exit(0);
    if (child > 0) waitpid((pid_t)child, NULL, 0);
    report("clone_newuser", child);
    P("clone3", SYS_clone3, NULL, 0);
    P("statmount", 457, NULL, NULL, 0, 0);
    P("listmount", 458, NULL, NULL, 0, 0);
    char source[8] = "data", target[8];
    struct iovec local = {target, sizeof target}, remote = {source, sizeof source};
    P("process_vm_readv", SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0);
    P("process_vm_writev", SYS_process_vm_writev, getpid(), &remote, 1, &local, 1, 0);
    P("kexec_load", SYS_kexec_load, 0, 0, NULL, ~0ul);
    P("kexec_file_load", SYS_kexec_file_load, -1, -1, 0, NULL, ~0ul);
    P("init_module", SYS_init_module, NULL, 0, "");
    P("finit_module", SYS_finit_module, -1, "", 0);
    P("delete_module", SYS_delete_module, "moat_none_such", O_NONBLOCK);
    P("open_by_handle_at", SYS_open_by_handle_at, -1, NULL, 0);
    struct { unsigned int bytes; int type; } handle = {0, 0};
    int mount_id = 0;
    P("name_to_handle_at", SYS_name_to_handle_at, AT_FDCWD, "/", &handle, &mount_id, 0);
    P("personality", SYS_personality, 0x0008 /* PER_LINUX32 */);
    P("personality_high_bits", SYS_personality, (1ul << 32) | 0x0008);
    syscall(SYS_personality, 0);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    char c = 'x';
    P("tiocsti", SYS_ioctl, null, TIOCSTI, &c);
    P("tiocsti_high_bits", SYS_ioctl, null, (1ul << 32) | TIOCSTI, &c);
    P("tioclinux", SYS_ioctl, null, TIOCLINUX, &c);
    P("reboot", SYS_reboot, 0, 0, 0, NULL);
    P("swapon", SYS_swapon, NULL, 0);
    P("chroot", SYS_chroot, bad);
    P("sethostname", SYS_sethostname, "x", 100000);
    P("clock_settime", SYS_clock_settime, 0x7fff, NULL);
    P("syslog", SYS_syslog, 0x7fff, NULL, 0);
    P("iopl", SYS_iopl, 99);
    P("pidfd_getfd", SYS_pidfd_getfd, -1, 0, 0);
    P("kcmp", SYS_kcmp, getpid(), getpid(), 0x7fff, 0, 0);
    P("io_uring_enter", SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0);
    P("future_syscall", 1000, 0);
    P("getpid", SYS_getpid);
    printf("done\n");
    return 0;
}
