"""Locking down the sandbox child process. The threat model is hostile agent code that owns the
child's Python interpreter, so only the kernel layers count.

Called once by sandbox_child.py after it has imported everything and received its gated tables,
and before it runs any agent code. Layers, in the order applied: rlimits; an empty root in the
child's own mount namespace; Landlock with no rights granted back; a pinned descriptor table
(every number below RLIMIT_NOFILE taken); no transparent huge pages; a seccomp allowlist on every thread, with no_new_privs;
an audit hook, a convenience for friendly errors that nothing depends on. What each layer refuses,
how the allowlist was measured, and what each kernel provides: docs/agent_api.md, "The layers".
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
import sys

STDERR_LIMIT = 1 << 20

# --- seccomp ----------------------------------------------------------------------------------

# The architectures the allowlist is written and tested for (syscall names are resolved per
# architecture by libseccomp; a name the architecture lacks, e.g. poll on aarch64, is skipped).
SECCOMP_ARCHES = ("x86_64", "aarch64")

# Allowed with any arguments: they act on memory, on this process's own threads and signals, on
# clocks, or on descriptors the child already holds (its pipes, its stderr file, /dev/null and
# polars' internal wake-up descriptors). The set is what the child was measured to call after
# lockdown (strace -ff over real code blocks; docs/agent_api.md says how), plus the calls a
# signal or an exit makes.
ALLOWED_SYSCALLS = (
    "read",
    "readv",
    "write",
    "writev",
    "lseek",
    "close",
    "munmap",
    "mremap",
    "brk",
    "set_robust_list",
    "rseq",
    "sched_yield",
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sigaltstack",
    "restart_syscall",
    "gettimeofday",
    "nanosleep",
    "getpid",
    "gettid",
    "getrandom",
    "getrlimit",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "exit",
    "exit_group",
)
_PROT_EXEC = 0x4
# mmap(MAP_HUGETLB) takes pages from the host's one hugetlb pool (vm.nr_hugepages): its free count is
# state every sandbox shares, a clean channel between concurrent episodes where a pool exists.
# The same value on x86_64 and aarch64 (asm-generic/mman-common.h).
_MAP_HUGETLB = 0x40000
# futex(2) on private futexes only (FUTEX_PRIVATE_FLAG): a shared futex on a file-backed page is
# keyed by (inode, offset), so two sandboxes that map the same file (libc's text, a month's table
# part) could wait and wake each other, a channel between concurrent episodes of different cutoffs.
# A private one is keyed by the process's own address space. glibc's locks, Python's, Rust's
# (polars) and OpenBLAS's are private; futex_waitv (shared unless each waiter says otherwise) is
# not allowed at all. One shared futex is honest: pthread_join(3) waits on the joined thread's tid
# word as a shared futex (glibc nptl/pthread_join_common.c), which tokio's blocking pool in polars
# does when an idle thread exits; refused with EPERM, glibc aborts the process. A shared wait
# (FUTEX_WAIT, FUTEX_WAIT_BITSET, either clock) therefore fails with EAGAIN, "the word changed",
# before the kernel looks at the word: glibc re-reads the tid and waits again until the exiting
# thread has cleared it, and no wait on a shared key is ever made. Shared wakes stay refused.
_FUTEX_PRIVATE_FLAG = 128
_FUTEX_OP_MASK = 0x7F | _FUTEX_PRIVATE_FLAG  # the operation and the private flag, not the clock bit
_FUTEX_SHARED_WAITS = (0, 9)  # FUTEX_WAIT, FUTEX_WAIT_BITSET (linux/futex.h)
# madvise(2) advice the allocators and libraries use, and nothing else (linux/mman-common.h): NORMAL,
# RANDOM, SEQUENTIAL, WILLNEED, DONTNEED, FREE, DONTFORK, DOFORK, HUGEPAGE, NOHUGEPAGE, DONTDUMP,
# DODUMP, WIPEONFORK, KEEPONFORK. Refused: REMOVE (9), MERGEABLE/UNMERGEABLE (12, 13: KSM merges
# equal pages across processes, a timing channel), COLD and PAGEOUT (20, 21: they drop shared table
# pages from the page cache, a channel that outlives a sandbox and a way to slow every episode),
# POPULATE_READ/WRITE (22, 23), DONTNEED_LOCKED (24), COLLAPSE (25), and from 100 up poisoning or
# offlining a physical page (with CAP_SYS_ADMIN, which a root child without a user namespace holds).
MADVICE_ALLOWED = (0, 1, 2, 3, 4, 8, 10, 11, 14, 15, 16, 17, 18, 19)
# Between its blocks a sandbox child is stopped (SIGSTOP) so that it never runs beside a sandbox of
# another cutoff (cutoff_gate.py); a SIGCONT of its own would cancel that stop, and the other job
# control signals (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU) have no honest use. Real-time signals (32-64)
# queue one entry per send against the host user's RLIMIT_SIGPENDING, a count every sandbox shares
# (a re-attack read 32 bits through it without an error), so a child may signal itself only with
# the standard ones, which queue at most once each. Each number is matched exactly: the kernel
# reads the signal as an int, so a "not SIGCONT" rule let 18 | 1 << 32 through. The same numbers on
# x86_64 and aarch64 (asm-generic/signal.h).
_SIGNALS_TO_ITSELF = tuple(n for n in range(32) if n not in (18, 19, 20, 21, 22))
# The clocks a child may read, sleep on or ask the resolution of: the system-wide and its own
# CPU-time ones (CLOCK_REALTIME .. CLOCK_TAI, linux/time.h). A clock id made from a pid (a negative
# one, clock_getcpuclockid(3)) reads that process's CPU time, which another sandbox could encode
# bits in where the child shares a PID namespace with others.
_CLOCKS = tuple(range(12))
_TCGETS = 0x5401
_PR_SET_NAME, _PR_GET_NAME, _PR_SET_VMA = 15, 16, 0x53564D41


def machine() -> str:
    return platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")


def seccomp_filter(pid: int):
    """The allowlist filter for this process (``pid`` as the process sees itself)."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    flt.set_attr(sc.Attr.CTL_TSYNC, 1)
    flt.set_attr(sc.Attr.CTL_NNP, 1)
    arch = sc.system_arch()

    def rule(action, name, *args):
        if sc.resolve_syscall(arch, name) >= 0:  # negative: unknown on this architecture
            flt.add_rule(action, name, *args)

    for name in ALLOWED_SYSCALLS:
        rule(sc.ALLOW, name)
    no_exec = sc.Arg(2, sc.MASKED_EQ, _PROT_EXEC, 0)
    rule(sc.ALLOW, "mmap", no_exec, sc.Arg(3, sc.MASKED_EQ, _MAP_HUGETLB, 0))
    rule(sc.ALLOW, "mprotect", no_exec)
    for advice in MADVICE_ALLOWED:
        rule(sc.ALLOW, "madvise", sc.Arg(2, sc.EQ, advice))
    rule(sc.ALLOW, "futex", sc.Arg(1, sc.MASKED_EQ, _FUTEX_PRIVATE_FLAG, _FUTEX_PRIVATE_FLAG))
    for wait in _FUTEX_SHARED_WAITS:
        rule(sc.ERRNO(errno.EAGAIN), "futex", sc.Arg(1, sc.MASKED_EQ, _FUTEX_OP_MASK, wait))
    for clock in _CLOCKS:
        for name in ("clock_gettime", "clock_getres", "clock_nanosleep"):
            rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, clock))
    for signum in _SIGNALS_TO_ITSELF:
        rule(sc.ALLOW, "tgkill", sc.Arg(0, sc.EQ, pid), sc.Arg(2, sc.EQ, signum))
        rule(sc.ALLOW, "kill", sc.Arg(0, sc.EQ, pid), sc.Arg(1, sc.EQ, signum))
    for self_pid in (0, pid):
        rule(sc.ALLOW, "prlimit64", sc.Arg(0, sc.EQ, self_pid), sc.Arg(2, sc.EQ, 0))
        rule(sc.ALLOW, "sched_getaffinity", sc.Arg(0, sc.EQ, self_pid))
    rule(sc.ALLOW, "ioctl", sc.Arg(1, sc.EQ, _TCGETS))
    for option in (_PR_SET_NAME, _PR_GET_NAME, _PR_SET_VMA):
        rule(sc.ALLOW, "prctl", sc.Arg(0, sc.EQ, option))
    return flt


def install_seccomp() -> str:
    """Load the allowlist on every thread; return what was installed, or raise OSError."""
    if sys.platform != "linux" or machine() not in SECCOMP_ARCHES:
        raise OSError(
            f"no seccomp allowlist for {sys.platform}/{platform.machine()} "
            f"(written for Linux {', '.join(SECCOMP_ARCHES)})"
        )
    seccomp_filter(os.getpid()).load()
    return f"allowlist (default EPERM) on every thread, {machine()}"


# --- namespaces -------------------------------------------------------------------------------

# unshare(2) flags: what `unshare --user --map-root-user --mount --ipc --net --pid` asks for.
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
NAMESPACES = "user, mount, IPC, network and PID namespaces of its own"
_PR_SET_PDEATHSIG = 1


def enter_namespaces() -> str:
    """Move this (single-threaded) process into new user, mount, IPC, network and PID namespaces,
    root of the user namespace and nobody outside it (user_namespaces(7): uid 0 inside maps to this
    uid only); return NAMESPACES or why not (nothing changed then). The PID namespace takes effect
    for the children forked after this call: the first is its PID 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWNET | _CLONE_NEWPID
    if libc.unshare(flags) != 0:
        return f"unavailable: unshare(user, mount, IPC, network, PID) failed: {os.strerror(ctypes.get_errno())}"
    # setgroups must be denied before an unprivileged gid_map is written (user_namespaces(7)).
    for name, line in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(line)
    return NAMESPACES


def die_with_parent(parent_pid: int | None) -> None:
    """SIGKILL this process when its parent ends (prctl PR_SET_PDEATHSIG); ``parent_pid``: the
    parent it must still have (None where it cannot be seen, e.g. from PID 1 of a new namespace),
    else it ends now, since a parent that died before the call sends nothing."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


# --- an empty root ----------------------------------------------------------------------------

# Any directory that exists: the tmpfs covers it only inside the child's own mount namespace.
EMPTY_ROOT_AT = b"/tmp"
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def enter_empty_root(parent_mount_namespace: str | None) -> str:
    """Make an empty read-only tmpfs the root of every thread and drop all capabilities; return
    what was done or why not. Only in a mount namespace of our own (not the parent's, whose id the
    parent sends): in the parent's, mounting would cover the host's directory."""
    if parent_mount_namespace is None or os.readlink("/proc/self/ns/mnt") == parent_mount_namespace:
        return "unavailable: not in a mount namespace of its own"
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if libc.mount(b"none", EMPTY_ROOT_AT, b"tmpfs", ctypes.c_ulong(flags), b"size=4k,nr_inodes=1,mode=0555") != 0:
        return f"unavailable: mounting the empty root failed: {os.strerror(ctypes.get_errno())}"
    os.chdir(EMPTY_ROOT_AT)
    os.chroot(".")
    os.chdir("/")
    # capset(2) with a version-3 header and all-zero effective, permitted and inheritable sets (two
    # 32-bit words each). Capabilities are per thread: this one, which runs agent code, and the
    # threads it starts hold none; polars' pool keeps the user namespace's (never the host's), and
    # every call that would use them is refused by seccomp.
    header, data = struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0), bytes(24)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset: dropping the user namespace's capabilities failed")
    return (
        "an empty read-only root (tmpfs) in its own mount namespace, on every thread; "
        "no capabilities on the agent's thread"
    )


# --- Landlock ---------------------------------------------------------------------------------


class _Landlock:
    """A ruleset denying everything the running kernel lets Landlock deny, not yet enforced."""

    def __init__(self):
        import landlockpy as ll

        self.abi = ll.abi_version()
        self.ruleset = None
        if self.abi >= 1:
            # handled_fs/handled_net None = every right the library knows, cut to the kernel's ABI.
            self.ruleset = ll.Ruleset(scoped=ll.Scope.ABSTRACT_UNIX_SOCKET | ll.Scope.SIGNAL)

    def enforce(self) -> str:
        if self.ruleset is None:
            return "unavailable: the kernel has no Landlock (ABI 0)"
        import landlockpy as ll

        with self.ruleset as ruleset:
            ruleset.restrict(ll.RestrictFlag.TSYNC)  # dropped below ABI 8
            handled = [
                f"fs={int(ruleset.handled_fs):#x}",
                f"net={int(ruleset.handled_net):#x}",
                f"scoped={int(ruleset.scoped):#x}",
            ]
        threads = "every thread" if self.abi >= 8 else "the thread that runs agent code and the threads it starts"
        return f"ABI {self.abi}: no filesystem or network access ({', '.join(handled)}), on {threads}"


# --- rlimits ----------------------------------------------------------------------------------


def _vm_size_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


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
    return {"address_space_mb": address_space // 2**20, "cpu_limit_s": cpu_now + cpu_budget_s}


def _pin_descriptors(top: int, filler: int) -> int:
    """Duplicate ``filler`` into every free descriptor number up to ``top``, then set RLIMIT_NOFILE
    just above: the kernel hands out the lowest free number, so none is left. (dup, not open:
    Landlock already refuses to open /dev/null.)"""
    while True:
        fd = os.dup(filler)
        if fd > top:
            os.close(fd)
            break
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, top + 1))
    return top + 1


# --- transparent huge pages -------------------------------------------------------------------

_PR_SET_THP_DISABLE, _PR_GET_THP_DISABLE = 41, 42


def disable_transparent_hugepages() -> str:
    """No transparent huge page for any mapping of this process, now or later (prctl
    PR_SET_THP_DISABLE: a flag on the whole address space, which the allowlist lets no child clear).
    The huge zero page is one 2 MiB folio for the whole machine, allocated on the first read fault of
    a THP-eligible anonymous region (MADV_HUGEPAGE, which the allocators use) and freed only at a
    reclaim after the last process mapping it has ended: a late sandbox could make it exist and an
    early one that starts later time whether it does (docs/agent_api.md, "Other episodes are
    adversaries too"). Off, a read fault maps the 4 KiB zero page, which always exists, and
    khugepaged collapses none of the child's mappings (nor, where the kernel has
    CONFIG_READ_ONLY_THP_FOR_FS, the page cache of a file the child maps)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 or libc.prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) != 1:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")
    return "off for every mapping (PR_SET_THP_DISABLE)"


# --- audit hook -------------------------------------------------------------------------------

# Events ordinary analysis code raises. Everything else (open, os.*, socket.*, subprocess.*,
# ctypes.*, gc.*, sys._getframe, object.__getattr__ on frames and code, sys.addaudithook, ...)
# is refused.
ALLOWED_EVENTS = frozenset({"exec", "compile", "builtins.id", "time.sleep", "import"})


def install_audit_hook(
    allowed_modules: frozenset[str],
    libraries: frozenset[str] = frozenset(),
    library_events: frozenset[str] = frozenset(),
) -> None:
    """``libraries``: modules loaded for agent code besides ``allowed_modules``; ``library_events``:
    events those libraries raise in ordinary use (sandbox_child.LIBRARY_EVENTS)."""

    def hook(
        event,
        args,
        _events=ALLOWED_EVENTS,
        _modules=allowed_modules,
        _libraries=libraries,
        _library_events=library_events,
        _error=PermissionError,
    ):
        # No global or builtin name is looked up here: agent code could rebind those.
        if event in _events or event in _library_events:
            if event != "import":
                return
            top = args[0].partition(".")[0]
            if top in _modules or top in _libraries:
                return
            raise _error(f"sandbox: importing {args[0]!r} is not allowed")
        raise _error(f"sandbox: {event!r} is not allowed")

    sys.addaudithook(hook)


def lock_down(
    *,
    memory_mb: int,
    cpu_budget_s: int,
    allowed_modules: frozenset[str],
    libraries: frozenset[str] = frozenset(),
    library_events: frozenset[str] = frozenset(),
    parent_mount_namespace: str | None = None,
) -> dict:
    """Apply every layer; return what was applied (the sandbox reports it). A layer that could not
    be applied says why instead; the parent decides whether the sandbox may run without it."""
    report = set_limits(memory_mb, cpu_budget_s)
    filler = os.open(os.devnull, os.O_RDONLY)
    top = max(int(name) for name in os.listdir("/proc/self/fd"))  # filler included
    report["empty_root"] = enter_empty_root(parent_mount_namespace)
    try:
        landlock = _Landlock()
    except (ImportError, OSError) as exc:
        landlock = None
        report["landlock"] = f"unavailable: {exc}"
    if landlock is not None:
        try:
            report["landlock"] = landlock.enforce()
        except OSError as exc:
            report["landlock"] = f"unavailable: {exc}"
    report["nofile"] = _pin_descriptors(top, filler)
    try:
        report["transparent_hugepages"] = disable_transparent_hugepages()
    except OSError as exc:  # a kernel without THP (< 3.15 or CONFIG_TRANSPARENT_HUGEPAGE=n) has no huge zero page
        report["transparent_hugepages"] = f"unavailable: {exc}"
    try:
        report["seccomp"] = install_seccomp()
    except (ImportError, OSError, RuntimeError) as exc:  # pyseccomp raises RuntimeError without libseccomp
        report["seccomp"] = f"unavailable: {exc}"
    install_audit_hook(allowed_modules, libraries, library_events)
    report["audit_hook"] = "installed"
    return report
