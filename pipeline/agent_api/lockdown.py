"""Locking down the sandbox child process: kernel limits first, then Python's audit hook.

Called once by sandbox_child.py after it has imported everything and received its gated tables,
and before it runs any agent code. Layers, outermost first:

1. rlimits: RLIMIT_AS (address space = what the process uses now + the memory budget),
   RLIMIT_CPU (a CPU-seconds budget for the child's life), RLIMIT_FSIZE 0 and RLIMIT_CORE 0, and
   RLIMIT_NOFILE pinned so that every descriptor number below it is taken: any call that would
   create a file descriptor (open, socket, pipe, ...) fails with EMFILE, whatever language makes it.
2. seccomp-bpf (Linux x86_64 only), synchronised over every thread (polars' pool included), with
   no_new_privs: the syscalls that open paths, inspect paths, create sockets, execute programs,
   fork, signal or trace other processes, raise rlimits or set up io_uring fail with EPERM. This
   is the boundary that holds even if agent code escapes Python (e.g. through ctypes, which polars
   imports and so is in memory).
3. an audit hook (PEP 578) that allows only the events ordinary analysis code raises and imports of
   allow-listed modules; it denies open, os.* process and file calls, socket, subprocess, ctypes,
   gc introspection, frame access and adding hooks. Its state lives in default arguments of a
   function nobody can reach (no module global, no frame), so agent code cannot switch it off
   from Python.

Limits, honestly: layers 1 and 3 are bypassable by native-code tricks (ctypes memory writes) in a
process as privileged as ours; layer 2 is the real wall and exists only on Linux x86_64 with
seccomp filtering available (``report()['seccomp']`` says whether it was installed). Inside the
process everything is readable: the gated tables, the reference tables, the sandbox's own
protocol pipes. Nothing after the cutoff is in the process to read (the parent sends only the
environment's gated rows), which is what the date gate needs.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct
import sys

# --- seccomp ----------------------------------------------------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_SECCOMP_SYSCALL_X86_64 = 317
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_PR_SET_NO_NEW_PRIVS = 38
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000
# BPF opcodes: load word at absolute offset, jump-if-equal / -greater-or-equal / -bits-set, return.
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH = 0, 4
STDERR_LIMIT = 1 << 20


def _arg(i: int, high: bool = False) -> int:
    # seccomp_data.args[i] is a u64 at offset 16 + 8i; x86_64 is little-endian.
    return 16 + 8 * i + (4 if high else 0)


# x86_64 syscall numbers denied outright.
_DENY_X86_64 = {
    # opening, creating or inspecting paths
    "open": 2, "openat": 257, "openat2": 437, "creat": 85, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "open_tree": 428, "fsopen": 430, "fsmount": 432, "fspick": 433, "move_mount": 429,
    "stat": 4, "lstat": 6, "newfstatat": 262, "statx": 332, "access": 21, "faccessat": 269, "faccessat2": 439,
    "readlink": 89, "readlinkat": 267, "statfs": 137, "getxattr": 191, "lgetxattr": 192, "listxattr": 194,
    "llistxattr": 195, "setxattr": 188, "lsetxattr": 189, "removexattr": 197, "lremovexattr": 198,
    "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301, "chdir": 80, "fchdir": 81,
    "mknod": 133, "mknodat": 259, "unlink": 87, "unlinkat": 263, "rename": 82, "renameat": 264, "renameat2": 316,
    "mkdir": 83, "mkdirat": 258, "rmdir": 84, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266,
    "truncate": 76, "chmod": 90, "fchmodat": 268, "chown": 92, "lchown": 94, "fchownat": 260, "utime": 132,
    "utimes": 235, "utimensat": 280, "futimesat": 261, "uselib": 134, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427,
    # network
    "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288,
    # other processes
    "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "kill": 62, "tkill": 200, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "kcmp": 312,
    # limits and the system
    "setrlimit": 160, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
    "request_key": 249, "quotactl": 179, "swapon": 167, "swapoff": 168, "reboot": 169, "kexec_load": 246,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "acct": 163, "sethostname": 170,
    "setdomainname": 171, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "syslog": 103,
    "iopl": 172, "ioperm": 173,
}
_CLONE, _CLONE3, _TGKILL, _PRLIMIT64 = 56, 435, 234, 302


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program_x86_64(pid: int) -> bytes:
    """The BPF filter: kill on a foreign architecture or the x32 ABI; allow clone only for threads,
    tgkill only to our own process, prlimit64 only as a read; ENOSYS for clone3 (glibc then falls
    back to clone, which we can inspect); EPERM for the denied list; allow the rest."""
    prog = [
        _ins(_LD, _ARCH), _ins(_JEQ, _AUDIT_ARCH_X86_64, 1, 0), _ins(_RET, _RET_KILL_PROCESS),
        _ins(_LD, _NR), _ins(_JGE, _X32_SYSCALL_BIT, 0, 1), _ins(_RET, _RET_KILL_PROCESS),
        # clone: threads only
        _ins(_LD, _NR), _ins(_JEQ, _CLONE, 0, 4), _ins(_LD, _arg(0)), _ins(_JSET, _CLONE_THREAD, 0, 1),
        _ins(_RET, _RET_ALLOW), _ins(_RET, _RET_ERRNO | _EPERM),
        # tgkill: only to a thread of this process
        _ins(_LD, _NR), _ins(_JEQ, _TGKILL, 0, 4), _ins(_LD, _arg(0)), _ins(_JEQ, pid, 0, 1),
        _ins(_RET, _RET_ALLOW), _ins(_RET, _RET_ERRNO | _EPERM),
        # prlimit64: only with a NULL new limit (getrlimit)
        _ins(_LD, _NR), _ins(_JEQ, _PRLIMIT64, 0, 6), _ins(_LD, _arg(2)), _ins(_JEQ, 0, 0, 3),
        _ins(_LD, _arg(2, high=True)), _ins(_JEQ, 0, 0, 1), _ins(_RET, _RET_ALLOW), _ins(_RET, _RET_ERRNO | _EPERM),
        _ins(_LD, _NR), _ins(_JEQ, _CLONE3, 0, 1), _ins(_RET, _RET_ERRNO | _ENOSYS),
        _ins(_LD, _NR),
    ]
    for nr in sorted(_DENY_X86_64.values()):
        prog += [_ins(_JEQ, nr, 0, 1), _ins(_RET, _RET_ERRNO | _EPERM)]
    prog.append(_ins(_RET, _RET_ALLOW))
    return b"".join(prog)


def install_seccomp() -> str:
    """Install the filter on every thread; return 'installed' or why not."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"unavailable on {sys.platform}/{platform.machine()} (filter written for Linux x86_64)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"unavailable: prctl(NO_NEW_PRIVS) failed, errno {ctypes.get_errno()}"
    code = seccomp_program_x86_64(os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padded to 16 bytes)
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_SECCOMP_SYSCALL_X86_64), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), fbuf)
    if rc != 0:
        return f"unavailable: seccomp() returned {rc}, errno {ctypes.get_errno()}"
    return "installed"


# --- rlimits ----------------------------------------------------------------------------------

def _vm_size_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _pin_descriptor_limit() -> int:
    """Fill every free descriptor number below the highest open one with /dev/null, then set
    RLIMIT_NOFILE just above it: the kernel hands out the lowest free number, so none is left."""
    top = max(int(name) for name in os.listdir("/proc/self/fd"))
    while True:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd > top:
            os.close(fd)
            break
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, top + 1))
    return top + 1


def set_limits(memory_mb: int, cpu_budget_s: int) -> dict:
    used_cpu = resource.getrusage(resource.RUSAGE_SELF)
    cpu_now = int(used_cpu.ru_utime + used_cpu.ru_stime) + 1
    address_space = _vm_size_bytes() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    # Soft limit: SIGXCPU (terminates); hard limit a little later: SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_now + cpu_budget_s, cpu_now + cpu_budget_s + 5))
    # Bounds the only file the child may write: its stderr (the parent keeps it for crash reports).
    resource.setrlimit(resource.RLIMIT_FSIZE, (STDERR_LIMIT, STDERR_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = _pin_descriptor_limit()
    return {"address_space_mb": address_space // 2**20, "cpu_limit_s": cpu_now + cpu_budget_s, "nofile": nofile}


# --- audit hook -------------------------------------------------------------------------------

# Events ordinary analysis code raises. Everything else (open, os.*, socket.*, subprocess.*,
# ctypes.*, gc.*, sys._getframe, object.__getattr__ on frames and code, sys.addaudithook, ...)
# is refused.
ALLOWED_EVENTS = frozenset({"exec", "compile", "builtins.id", "time.sleep", "import"})


def install_audit_hook(allowed_modules: frozenset[str]) -> None:
    def hook(event, args, _events=ALLOWED_EVENTS, _modules=allowed_modules, _error=PermissionError):
        # No global or builtin name is looked up here: agent code could rebind those.
        if event in _events:
            if event != "import":
                return
            if args[0].partition(".")[0] in _modules:
                return
            raise _error(f"sandbox: importing {args[0]!r} is not allowed")
        raise _error(f"sandbox: {event!r} is not allowed")

    sys.addaudithook(hook)


def lock_down(*, memory_mb: int, cpu_budget_s: int, allowed_modules: frozenset[str]) -> dict:
    """Apply every layer; return what was applied (the sandbox reports it)."""
    report = set_limits(memory_mb, cpu_budget_s)
    report["seccomp"] = install_seccomp()
    install_audit_hook(allowed_modules)
    report["audit_hook"] = "installed"
    return report
