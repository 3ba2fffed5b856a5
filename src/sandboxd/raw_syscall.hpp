// System calls for a child that shares its parent's memory (CLONE_VM without CLONE_VFORK, or
// before the parent resumes): no errno, no libc state. Used by the helper's sandbox child
// (sandbox_child.cpp, cloned by spawn_sandbox.cpp) and by pid 1's command children
// (command_child.cpp, cloned by agent_commands.cpp).
#pragma once

#include <linux/sched.h>
#include <sys/syscall.h>
#include <cerrno>
#include <cstddef>
#include <type_traits>

namespace moat::sandboxd {

// True where clone3_run has a sequence for this architecture.
#if defined(__x86_64__)
inline constexpr bool clone3_run_available = true;
#else
inline constexpr bool clone3_run_available = false;
#endif

template <class T>
inline long to_long(T value) {
    if constexpr (std::is_null_pointer_v<T>) {
        return 0;
    } else if constexpr (std::is_pointer_v<T>) {
        return reinterpret_cast<long>(value);
    } else {
        return static_cast<long>(value);
    }
}

// Raw system calls for a CLONE_VM child: glibc wrappers would write the parent's errno (the child
// shares its TLS). Returns the result or -errno.
template <class... Args>
inline long raw(long number, Args... args) {
    long a[6] = {};
    std::size_t i = 0;
    ((a[i++] = to_long(args)), ...);
    long result;
#if defined(__x86_64__)
    register long r10 asm("r10") = a[3];
    register long r8 asm("r8") = a[4];
    register long r9 asm("r9") = a[5];
    asm volatile("syscall"
                 : "=a"(result)
                 : "a"(number), "D"(a[0]), "S"(a[1]), "d"(a[2]), "r"(r10), "r"(r8), "r"(r9)
                 : "rcx", "r11", "memory");
#elif defined(__aarch64__)
    register long x8 asm("x8") = number;
    register long x0 asm("x0") = a[0];
    register long x1 asm("x1") = a[1];
    register long x2 asm("x2") = a[2];
    register long x3 asm("x3") = a[3];
    register long x4 asm("x4") = a[4];
    register long x5 asm("x5") = a[5];
    asm volatile("svc 0"
                 : "+r"(x0)
                 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                 : "memory");
    result = x0;
#else
#error "moat-sandboxd: add a raw syscall sequence for this architecture"
#endif
    return result;
}

// clone3 for the CLONE_VM child: it starts on `ca->stack` and runs fn(arg), then exits; the
// parent gets the pid or -errno. -ENOSYS where there is no sequence for this architecture.
inline long clone3_run(clone_args* ca, int (*fn)(void*), void* arg) {
#if defined(__x86_64__)
    long result;
    register long function asm("r12") = reinterpret_cast<long>(fn);
    register long argument asm("r13") = reinterpret_cast<long>(arg);
    asm volatile(
        "syscall\n\t"
        "testq %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xorl %%ebp, %%ebp\n\t"
        "movq %%r13, %%rdi\n\t"
        "callq *%%r12\n\t"
        "movl %%eax, %%edi\n\t"
        "movl $60, %%eax\n\t"  // exit
        "syscall\n\t"
        "hlt\n\t"
        "1:\n\t"
        : "=a"(result)
        : "0"(long{SYS_clone3}), "D"(ca), "S"(sizeof(clone_args)), "r"(function), "r"(argument)
        : "rcx", "r11", "memory");
    return result;
#else
    (void)ca;
    (void)fn;
    (void)arg;
    return -ENOSYS;
#endif
}

}  // namespace moat::sandboxd
