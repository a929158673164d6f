"""The code-block sandbox when agent code owns the interpreter (issue 14, part 2).

Every test here first switches the Python-level guards off the way an attacker does: the real
builtins through ``get_events.__globals__``, then ctypes pointer writes (which raise no audit
event) that turn the audit hook's allow-lists into sets containing everything. What is left is
the kernel: namespaces, Landlock, the pinned descriptor table and the seccomp allowlist. Each
attack is a raw syscall number through libc's ``syscall`` so that nothing in between can soften it,
with arguments that would do harm if the call went through; each must fail and leave no trace.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import struct
import subprocess
import sys
import textwrap
from datetime import date
from pathlib import Path

import pytest

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.lockdown import NAMESPACES, SECCOMP_ARCHES, STDERR_LIMIT, machine
from pipeline.agent_api.sandbox import MAX_OUTPUT_CHARS, REPLY_CAP_BYTES
from pipeline.agent_api.sandbox_spares import CHILD_ENVIRONMENT
from testbed.database import generate_event_database

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or machine() not in SECCOMP_ARCHES,
    reason=f"the sandbox's OS layer is built for Linux {', '.join(SECCOMP_ARCHES)}",
)

ENTER_NAMESPACES = "from pipeline.agent_api.lockdown import enter_namespaces; print(enter_namespaces())"


@functools.cache
def namespaces_here() -> str:
    """What a sandbox child gets on this machine: lockdown.enter_namespaces in a throwaway process,
    as the sandbox's forked child calls it (NAMESPACES, or why not)."""
    probe = subprocess.run(
        [sys.executable, "-c", ENTER_NAMESPACES], capture_output=True, text=True, env=CHILD_ENVIRONMENT, check=False
    )
    return probe.stdout.strip() or f"unavailable: {probe.stderr.strip()[-200:]}"


# The bypass, as agent code: reach sys through the API's module globals, then overwrite the type
# of the audit hook's two allow-lists (ALLOWED_EVENTS in lockdown.py, ALLOWED_MODULES in the
# child's __main__) with a frozenset subclass whose ``in`` is always true. ``_mem`` is a pointer
# to a ctypes cell; indexing it reads and writes any address relative to the cell's buffer.
BYPASS = textwrap.dedent("""
    _B = get_events.__globals__['__builtins__']
    _sys = _B['__import__']('sys')
    _ctypes = _sys.modules['ctypes']
    class _Everything(frozenset):
        __slots__ = ()
        def __contains__(self, item):
            return True
    _cell = _ctypes.c_ssize_t(0)
    _mem = _ctypes.pointer(_cell)
    _base = next(id(_cell) + 16 + 8 * k for k in range(1, 16) if _mem[-k] == id(_cell) + 16 + 8 * k)
    for _target in (_sys.modules['pipeline.agent_api.lockdown'].ALLOWED_EVENTS, _sys.modules['__main__'].ALLOWED_MODULES):
        _mem[(id(_target) + 8 - _base) // 8] = id(_Everything)
    _libc = _ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = _ctypes.c_long
    import socket as _socket  # refused by the import guard and the audit hook while they stand
    print('guards off')
""")

# Runs ATTACKS (a list of (label, number, args)) and prints "label rc errno" per attack. An
# argument is an int, "P:text" (a C string), "B:n" (a zeroed buffer of n bytes) or "X:hex" (bytes).
RUN_ATTACKS = textwrap.dedent("""
    def _arg(a):
        if isinstance(a, str):
            kind, _, value = a.partition(':')
            if kind == 'P':
                return _ctypes.c_char_p(value.encode())
            if kind == 'B':
                return _ctypes.create_string_buffer(int(value))
            return _ctypes.create_string_buffer(bytes.fromhex(value), len(value) // 2)
        return _ctypes.c_long(a)
    for _label, _nr, _args in ATTACKS:
        _ctypes.set_errno(0)
        _rc = _libc.syscall(_ctypes.c_long(_nr), *[_arg(a) for a in _args])
        print(_label, _rc, _ctypes.get_errno())
""")

# (x86_64 number, aarch64 number or None where the call does not exist there)
NUMBERS = {
    "open": (2, None),
    "openat": (257, 56),
    "openat2": (437, 437),
    "creat": (85, None),
    "socket": (41, 198),
    "connect": (42, 203),
    "fork": (57, None),
    "vfork": (58, None),
    "clone": (56, 220),
    "clone3": (435, 435),
    "execve": (59, 221),
    "execveat": (322, 281),
    "memfd_create": (319, 279),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "pidfd_open": (434, 434),
    "kill": (62, 129),
    "tgkill": (234, 131),
    "prlimit64": (302, 261),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "bpf": (321, 280),
    "io_uring_setup": (425, 425),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "mount": (165, 40),
    "unshare": (272, 97),
    "setns": (308, 268),
    "chroot": (161, 51),
    "chmod": (90, None),
    "fchmodat": (268, 53),
    "fchmodat2": (452, 452),
    "chown": (92, None),
    "utimensat": (280, 88),
    "rename": (82, None),
    "renameat2": (316, 276),
    "unlink": (87, None),
    "unlinkat": (263, 35),
    "truncate": (76, 45),
    "mkdirat": (258, 34),
    "symlinkat": (266, 36),
    "linkat": (265, 37),
    "mknodat": (259, 33),
    "setxattr": (188, 5),
    "getxattr": (191, 8),
    "listxattr": (194, 11),
    "setxattrat": (463, 463),
    "getxattrat": (464, 464),
    "stat": (4, None),
    "newfstatat": (262, 79),
    "statx": (332, 291),
    "faccessat2": (439, 439),
    "readlinkat": (267, 78),
    "chdir": (80, 49),
    "listmount": (458, 458),
    "statmount": (457, 457),
    "shmget": (29, 194),
    "shmat": (30, 196),
    "msgget": (68, 186),
    "semget": (64, 190),
    "sched_setaffinity": (203, 122),
    "setpriority": (141, 140),
    "sched_setscheduler": (144, 119),
    "mmap": (9, 222),
    "mprotect": (10, 226),
    "mremap": (25, 216),
    "madvise": (28, 233),
    "futex": (202, 98),
    "futex_waitv": (449, 449),
    "pivot_root": (155, 41),
    "umount2": (166, 39),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "mount_setattr": (442, 442),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "tkill": (200, 130),
    "rt_sigqueueinfo": (129, 138),
    "pidfd_send_signal": (424, 424),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "request_key": (249, 218),
    "clock_settime": (227, 112),
    "settimeofday": (164, 170),
    "adjtimex": (159, 171),
    "reboot": (169, 142),
    "kexec_load": (246, 104),
    "swapon": (167, 224),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "syslog": (103, 116),
    "init_module": (175, 105),
    "ioperm": (173, None),
    "iopl": (172, None),
    "modify_ldt": (154, None),
    "arch_prctl": (158, None),
    "personality": (135, 92),
    "pkey_mprotect": (329, 288),
    "remap_file_pages": (216, 234),
    "sched_setattr": (314, 274),
    "ioprio_set": (251, 30),
    "migrate_pages": (256, 238),
    "setresuid": (117, 147),
    "capset": (126, 91),
    "prctl": (157, 167),
    "ioctl": (16, 29),
    "pread64": (17, 67),
    "pwrite64": (18, 68),
    "sendfile": (40, 71),
    "splice": (275, 76),
    "copy_file_range": (326, 285),
    "fstat": (5, 80),
    "fchmod": (91, 52),
    "fchown": (93, 55),
    "ftruncate": (77, 46),
    "fallocate": (285, 47),
    "getdents64": (217, 61),
    "fchdir": (81, 50),
    "dup3": (292, 24),
    "fcntl": (72, 25),
    "pipe2": (293, 59),
    "eventfd2": (290, 19),
    "io_setup": (206, 0),
    "mlockall": (151, 230),
    "setitimer": (38, 103),
    "timer_create": (222, 107),
}
# Newer than the oldest kernel the sandbox runs on: probed first, skipped if the kernel lacks them.
PROBED = (
    "futex_waitv",
    "memfd_create",
    "execveat",
    "userfaultfd",
    "bpf",
    "statx",
    "io_uring_setup",
    "pidfd_open",
    "clone3",
    "openat2",
    "faccessat2",
    "fchmodat2",
    "statmount",
    "listmount",
    "setxattrat",
    "getxattrat",
    "open_tree",
    "move_mount",
    "fsopen",
    "mount_setattr",
    "pkey_mprotect",
    "pidfd_send_signal",
)
AT_FDCWD = -100
LSMT_ROOT = 0xFFFFFFFFFFFFFFFF
MiB = 2**20
ATTACK_SEGMENT = 768 * MiB  # what the attacker asked for, four times per episode
PROBE_SEGMENT = MiB + 3 * 4096  # a size nothing else on the machine asks for


def _nr(name: str) -> int | None:
    return NUMBERS[name][0 if machine() == "x86_64" else 1]


def _unknown_to_kernel(name: str) -> bool:
    """Whether this kernel lacks the syscall: called here, unconfined, with arguments the kernel
    rejects before doing anything (-1 everywhere), ENOSYS means it does not know the number."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(_nr(name)), *[ctypes.c_long(-1)] * 6)
    return rc == -1 and ctypes.get_errno() == errno.ENOSYS


def _attacks(target: Path, parent: int, parent_address: int) -> list[tuple[str, str, list]]:
    """(label, syscall name, args): each would harm a file, another process or the host if it went
    through. ``target`` is a file outside the sandbox, ``parent`` the evaluation process."""
    t, t2, d = f"P:{target}", f"P:{target}.renamed", f"P:{target.parent}/planted"
    how = "B:24"  # struct open_how {flags, mode, resolve} = O_RDONLY
    xattr_args = "B:16"  # struct xattr_args {value, size, flags}: an empty value
    mnt_req = "X:" + struct.pack("<IIQQ", 24, 0, LSMT_ROOT, 0).hex()
    cpu0 = "X:" + (1).to_bytes(128, "little").hex()
    limits = "X:" + struct.pack("<QQ", 1 << 20, 1 << 20).hex()
    sockaddr = "X:" + struct.pack("<HH4s8x", 2, 9, bytes([127, 0, 0, 1])).hex()
    iov = "X:" + struct.pack("<QQ", parent_address, 8).hex()
    return [
        ("open", "open", [t, 0]),
        ("open_write", "open", [t, os.O_WRONLY | os.O_TRUNC]),
        ("openat", "openat", [AT_FDCWD, t, 0]),
        ("openat_root", "openat", [AT_FDCWD, "P:/", os.O_DIRECTORY]),
        ("openat2", "openat2", [AT_FDCWD, t, how, 24]),
        ("creat", "creat", [d, 0o755]),
        ("socket", "socket", [2, 1, 0]),
        ("connect", "connect", [1, sockaddr, 16]),
        ("fork", "fork", []),
        ("vfork", "vfork", []),
        ("clone_process", "clone", [17, 0, 0, 0, 0]),
        ("clone3", "clone3", ["B:88", 88]),
        ("execve", "execve", ["P:/bin/true", 0, 0]),
        ("execveat", "execveat", [AT_FDCWD, "P:/bin/true", 0, 0, 0]),
        ("memfd_create", "memfd_create", ["P:x", 0]),
        ("ptrace", "ptrace", [16, parent, 0, 0]),
        ("process_vm_readv", "process_vm_readv", [parent, "B:16", 1, iov, 1, 0]),
        ("pidfd_open", "pidfd_open", [parent, 0]),
        ("kill_parent", "kill", [parent, 0]),
        ("kill_group", "kill", [0, 0]),
        ("kill_all", "kill", [-1, 0]),
        ("tgkill_parent", "tgkill", [parent, parent, 0]),
        ("prlimit64_parent", "prlimit64", [parent, 7, limits, 0]),
        ("prlimit64_raise_own", "prlimit64", [0, 7, limits, 0]),
        ("keyctl", "keyctl", [1, 0]),
        ("add_key", "add_key", ["P:user", "P:mirai", "P:data", 4, -2]),
        ("bpf", "bpf", [0, "B:128", 128]),
        ("io_uring_setup", "io_uring_setup", [1, "B:120"]),
        ("userfaultfd", "userfaultfd", [0]),
        ("perf_event_open", "perf_event_open", ["B:128", 0, -1, -1, 0]),
        ("mount", "mount", ["P:none", f"P:{target.parent}", "P:tmpfs", 0, 0]),
        ("unshare", "unshare", [0x10000000]),
        ("setns", "setns", [0, 0]),
        ("chroot", "chroot", ["P:/"]),
        ("chmod", "chmod", [t, 0o6777]),
        ("fchmodat", "fchmodat", [AT_FDCWD, t, 0o6777]),
        ("fchmodat2", "fchmodat2", [AT_FDCWD, t, 0o6777, 0]),
        ("chown", "chown", [t, 1, 1]),
        ("utimensat", "utimensat", [AT_FDCWD, t, 0, 0]),
        ("rename", "rename", [t, t2]),
        ("renameat2", "renameat2", [AT_FDCWD, t, AT_FDCWD, t2, 0]),
        ("unlink", "unlink", [t]),
        ("unlinkat", "unlinkat", [AT_FDCWD, t, 0]),
        ("truncate", "truncate", [t, 0]),
        ("mkdirat", "mkdirat", [AT_FDCWD, d, 0o755]),
        ("symlinkat", "symlinkat", ["P:/etc/passwd", AT_FDCWD, d]),
        ("linkat", "linkat", [AT_FDCWD, t, AT_FDCWD, d, 0]),
        ("mknodat", "mknodat", [AT_FDCWD, d, 0o10644, 0]),
        ("setxattr", "setxattr", [t, "P:user.mirai", "P:x", 1, 0]),
        ("getxattr", "getxattr", [t, "P:user.mirai", "B:64", 64]),
        ("listxattr", "listxattr", [t, "B:256", 256]),
        ("setxattrat", "setxattrat", [AT_FDCWD, t, 0, "P:user.mirai", xattr_args, 16]),
        ("getxattrat", "getxattrat", [AT_FDCWD, t, 0, "P:user.mirai", xattr_args, 16]),
        ("stat", "stat", [t, "B:256"]),
        ("newfstatat", "newfstatat", [AT_FDCWD, t, "B:256", 0]),
        ("statx", "statx", [AT_FDCWD, t, 0, 0x7FF, "B:256"]),
        ("faccessat2", "faccessat2", [AT_FDCWD, t, 0, 0]),
        ("readlinkat", "readlinkat", [AT_FDCWD, "P:/proc/self/exe", "B:256", 256]),
        ("chdir", "chdir", ["P:/tmp"]),
        ("listmount", "listmount", [mnt_req, "B:800", 100, 0]),
        ("statmount", "statmount", [mnt_req, "B:4096", 4096, 0]),
        ("shmget", "shmget", [0, ATTACK_SEGMENT, 0o1600]),
        ("shmat", "shmat", [0, 0, 0]),
        ("msgget", "msgget", [0, 0o1600]),
        ("semget", "semget", [0, 1, 0o1600]),
        ("sched_setaffinity_parent", "sched_setaffinity", [parent, 128, cpu0]),
        ("setpriority_parent", "setpriority", [0, parent, 19]),
        ("sched_setscheduler_parent", "sched_setscheduler", [parent, 5, "B:4"]),
        ("mmap_exec", "mmap", [0, 4096, 0x5, 0x22, -1, 0]),
        # The arguments the allowlist checks, pushed: clone for a thread (a task the host counts
        # against pid_max: a thread bomb, which no rlimit bounds for a root operator; without
        # CLONE_SIGHAND, so that the kernel would refuse it had seccomp let it through); PROT_EXEC
        # beside bits above 32; an executable view of the stderr file; page-poisoning advice; the
        # parent-death signal (which ends the child with unshare); a terminal ioctl but TCGETS.
        ("clone_thread", "clone", [0x10100, 0, 0, 0, 0]),
        ("clone_high_bits", "clone", [(1 << 32) | 17, 0, 0, 0, 0]),
        ("mmap_exec_high_bits", "mmap", [0, 4096, (1 << 32) | 5, 0x22, -1, 0]),
        ("mmap_stderr_exec", "mmap", [0, 4096, 0x5, 0x1, 2, 0]),
        # A huge page from the host's hugetlb pool, whose free count every sandbox shares (issue 30).
        ("mmap_hugetlb", "mmap", [0, 2 << 20, 0x3, 0x40022, -1, 0]),
        ("mmap_hugetlb_high_bits", "mmap", [0, 2 << 20, 0x3, (1 << 32) | 0x40022, -1, 0]),
        ("madvise_hwpoison", "madvise", [0x10000, 4096, 100]),
        ("madvise_soft_offline", "madvise", [0x10000, 4096, 101]),
        # Advice that reaches other processes' pages (issue 30): merging equal pages (KSM), dropping
        # shared file pages from the page cache, populating or removing a range.
        ("madvise_remove", "madvise", [0x10000, 4096, 9]),
        ("madvise_mergeable", "madvise", [0x10000, 4096, 12]),
        ("madvise_cold", "madvise", [0x10000, 4096, 20]),
        ("madvise_pageout", "madvise", [0x10000, 4096, 21]),
        ("madvise_populate_read", "madvise", [0x10000, 4096, 22]),
        ("madvise_collapse", "madvise", [0x10000, 4096, 25]),
        ("madvise_high_bits", "madvise", [0x10000, 4096, (1 << 32) | 21]),
        # Shared futexes: keyed by (inode, offset) on a file-backed page, so a wake reaches whoever
        # waits on the same file anywhere on the host (a channel between sandboxes).
        ("futex_wake_shared", "futex", [0x10000, 1, 1, 0, 0, 0]),
        ("futex_wait_shared", "futex", [0x10000, 0, 0, 0, 0, 0]),
        ("futex_wait_bitset_shared", "futex", [0x10000, 9 | 256, 0, 0, 0, 0xFFFFFFFF]),
        ("futex_wake_op_shared", "futex", [0x10000, 5, 1, 0, 0x10004, 0]),
        ("futex_requeue_shared", "futex", [0x10000, 3, 1, 1, 0x10004, 0]),
        ("futex_lock_pi_shared", "futex", [0x10000, 6, 0, 0, 0, 0]),
        ("futex_waitv", "futex_waitv", ["B:24", 1, 0, 0, 1]),
        ("prctl_pdeathsig", "prctl", [1, 0]),
        ("prctl_dumpable", "prctl", [4, 1]),
        ("prctl_set_mm", "prctl", [35, 1, 0]),
        ("prctl_name_high_bits", "prctl", [(1 << 32) | 15, "P:x"]),
        ("ioctl_tiocsti", "ioctl", [0, 0x5412, "P:x"]),
        # Namespaces, mounts and handles: leaving the empty root or reaching a host inode.
        ("pivot_root", "pivot_root", ["P:/", "P:/"]),
        ("umount2", "umount2", ["P:/", 2]),
        ("open_tree", "open_tree", [AT_FDCWD, "P:/", 1]),
        ("move_mount", "move_mount", [-1, "P:", AT_FDCWD, "P:/", 4]),
        ("fsopen", "fsopen", ["P:tmpfs", 0]),
        ("mount_setattr", "mount_setattr", [AT_FDCWD, "P:/", 0, "B:32", 32]),
        ("name_to_handle_at", "name_to_handle_at", [AT_FDCWD, t, "B:128", "B:4", 0]),
        ("open_by_handle_at", "open_by_handle_at", [2, "B:128", 0]),
        # Other processes, the machine's clock and kernel state (harmless arguments where a call that
        # went through would do damage: a wrong reboot magic, a path that does not exist).
        ("tkill_parent", "tkill", [parent, 0]),
        ("rt_sigqueueinfo_parent", "rt_sigqueueinfo", [parent, 10, "B:128"]),
        ("pidfd_send_signal", "pidfd_send_signal", [0, 0, 0, 0]),
        ("process_vm_writev", "process_vm_writev", [parent, "B:16", 1, iov, 1, 0]),
        ("kcmp", "kcmp", [parent, 1, 0, 0, 0]),
        ("request_key", "request_key", ["P:user", "P:mirai", 0, 0]),
        ("clock_settime", "clock_settime", [0, "B:16"]),
        ("settimeofday", "settimeofday", ["B:16", 0]),
        ("adjtimex", "adjtimex", ["B:208"]),
        ("reboot", "reboot", [0, 0, 0, 0]),
        ("kexec_load", "kexec_load", [0, 0, 0, 0]),
        ("swapon", "swapon", ["P:/nonexistent", 0]),
        ("acct", "acct", ["P:/nonexistent"]),
        ("quotactl", "quotactl", [0, "P:/nonexistent", 0, 0]),
        ("syslog_read", "syslog", [3, "B:4096", 4096]),
        ("init_module", "init_module", [0, 0, "P:"]),
        ("ioperm", "ioperm", [0x80, 1, 1]),
        ("iopl", "iopl", [3]),
        ("modify_ldt", "modify_ldt", [0, "B:64", 64]),
        ("arch_prctl", "arch_prctl", [0x1003, "B:8"]),
        ("personality_read_implies_exec", "personality", [0x0400000]),
        ("pkey_mprotect_exec", "pkey_mprotect", [0, 4096, 7, 0]),
        ("remap_file_pages", "remap_file_pages", [0, 4096, 0, 0, 0]),
        ("sched_setattr_parent", "sched_setattr", [parent, "B:48", 0]),
        ("ioprio_set_parent", "ioprio_set", [1, parent, 3 << 13]),
        ("migrate_pages_parent", "migrate_pages", [parent, 64, "B:8", "B:8"]),
        ("setresuid", "setresuid", [1, 1, 1]),
        ("capset", "capset", ["X:" + struct.pack("<Ii", 0x20080522, 0).hex(), "B:24"]),
        # The descriptors the child holds (pipes, its stderr file, /dev/null, polars' epoll and
        # eventfd): only read, write, seek and close work on them.
        ("pread64", "pread64", [2, "B:16", 16, 0]),
        ("pwrite64", "pwrite64", [2, "P:xx", 2, 0]),
        ("sendfile", "sendfile", [1, 2, 0, 100]),
        ("splice", "splice", [2, 0, 1, 0, 100, 0]),
        ("copy_file_range", "copy_file_range", [2, 0, 2, 0, 100, 0]),
        ("fstat", "fstat", [2, "B:256"]),
        ("fchmod", "fchmod", [2, 0o6777]),
        ("fchown", "fchown", [2, 1, 1]),
        ("ftruncate", "ftruncate", [2, 1 << 30]),
        ("fallocate", "fallocate", [2, 0, 0, 1 << 30]),
        ("getdents64", "getdents64", [2, "B:256", 256]),
        ("fchdir", "fchdir", [2]),
        ("dup3", "dup3", [2, 7, 0]),
        ("fcntl_setpipe_sz", "fcntl", [1, 1031, 1 << 20]),
        ("pipe2", "pipe2", ["B:8", 0]),
        ("eventfd2", "eventfd2", [0, 0]),
        ("io_setup", "io_setup", [1000, "B:8"]),
        ("mlockall", "mlockall", [3]),
        ("setitimer", "setitimer", [0, "B:32", 0]),
        ("timer_create", "timer_create", [0, 0, "B:8"]),
    ]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack-db")
    generate_event_database(root, date(2023, 11, 1), 2, seed=5, quads_per_day=20)
    environment = EventDatabase(root).environment(date(2023, 12, 10))
    yield environment
    environment.close()


def _host_segments(size: int) -> list[str]:
    """The host's SysV shared-memory segments of ``size`` bytes (other programs' are ignored)."""
    table = Path("/proc/sysvipc/shm")
    rows = table.read_text().splitlines()[1:] if table.exists() else []
    return [row for row in rows if int(row.split()[3]) == size]


@pytest.fixture(scope="module")
def attacked(env, tmp_path_factory):
    """Run every attack in one sandbox with the guards off; return (results, what was observed
    about the target file and the parent before and after)."""
    target = tmp_path_factory.mktemp("outside") / "keep.txt"
    target.write_text("keep")
    target.chmod(0o644)
    anchor = ctypes.c_uint64(0x6D69726169)  # an address in this process for process_vm_readv
    parent = os.getpid()
    attacks = [
        (label, _nr(name), args)
        for label, name, args in _attacks(target, parent, ctypes.addressof(anchor))
        if _nr(name) is not None and not (name in PROBED and _unknown_to_kernel(name))
    ]

    def parent_state():
        st = target.stat()
        return (
            target.read_text(),
            st.st_mode,
            st.st_mtime_ns,
            os.listxattr(target),
            sorted(target.parent.iterdir()),
            os.sched_getaffinity(parent),
            os.getpriority(os.PRIO_PROCESS, parent),
            os.sched_getscheduler(parent),
            _host_segments(ATTACK_SEGMENT),
        )

    before = parent_state()
    assert env.run_code(BYPASS).strip() == "guards off"
    observation = env.run_code(f"ATTACKS = {attacks!r}\n" + RUN_ATTACKS, timeout_s=60)
    results = {}
    for line in observation.splitlines():
        label, rc, err = line.split()
        results[label] = (int(rc), int(err))
    assert len(results) == len(attacks), observation
    return results, before, parent_state(), {label for label, _, _ in attacks}


LABELS = [label for label, _, _ in _attacks(Path("/x/y"), 1, 0)]
# A shared futex wait is refused with EAGAIN, which pthread_join retries (lockdown.py); on the
# unmapped word the kernel itself would answer EFAULT, so EAGAIN is the filter's.
REFUSED_WITH = {"futex_wait_shared": errno.EAGAIN, "futex_wait_bitset_shared": errno.EAGAIN}


@pytest.mark.parametrize("label", LABELS)
def test_every_attack_fails_with_the_python_guards_off(attacked, label):
    results, _, _, run = attacked
    name = next(n for lab, n, _ in _attacks(Path("/x/y"), 1, 0) if lab == label)
    if _nr(name) is None:
        pytest.skip(f"{name} does not exist on {machine()}")
    if label not in run:
        pytest.skip(f"this kernel does not know {name} (syscall {_nr(name)} answered ENOSYS unconfined)")
    rc, err = results[label]
    assert rc == -1, f"{label} succeeded (returned {rc})"
    expected = REFUSED_WITH.get(label, errno.EPERM)  # the seccomp allowlist's answer
    assert err == expected, f"{label}: errno {errno.errorcode.get(err, err)}"


def test_the_attacks_leave_no_trace(attacked):
    """The file outside keeps its bytes, mode, times and (no) xattrs, nothing is planted beside
    it, the evaluation process keeps its CPU set, priority and scheduler, and no SysV segment
    appears on the host."""
    _, before, after, _ = attacked
    assert after == before


def test_no_thread_starts_and_the_api_still_works_after_the_attacks(env, attacked):
    """A thread bomb (small native stacks, about 20 KiB of address space each: the default memory
    budget holds 13,000, a 1 GiB one 50,000, more than a pid_max of 32,768, so the host could start
    no process) starts
    nothing, and the allowlist keeps what analysis needs: the API answers, memory comes and goes."""
    code = (
        "_thread = _sys.modules['_thread']\n_started = 0\ntry:\n"
        "    for _ in range(100):\n        _thread.start_new_thread(_sys.modules['time'].sleep, (60,))\n"
        "        _started += 1\nexcept RuntimeError:\n    pass\n"
        "_attr = _ctypes.create_string_buffer(64)\n_libc.pthread_attr_init(_attr)\n"
        "_libc.pthread_attr_setstacksize(_attr, _ctypes.c_size_t(16384))\n_tid = _ctypes.c_ulong()\n"
        "_native = [_libc.pthread_create(_ctypes.byref(_tid), _attr, _ctypes.cast(_libc.sleep, _ctypes.c_void_p),"
        " _ctypes.c_void_p(60)) for _ in range(100)]\n"
        "print(_started, sum(rc == 0 for rc in _native), count_events() > 0, len(bytearray(64 * 2**20)))"
    )
    assert env.run_code(code).split() == ["0", "0", "True", str(64 * 2**20)]


def test_memory_calls_stay_within_the_budget(env, attacked):
    """The memory calls the allowlist lets through cannot take more than the address-space limit:
    a 64 GiB reservation without backing (MAP_NORESERVE), a locked 2 GiB mapping, growing a page
    to 64 GiB with mremap."""
    gib, mmap, mremap = 2**30, _nr("mmap"), _nr("mremap")
    code = (
        "_c = lambda *a: (_ctypes.set_errno(0), _libc.syscall(*[_ctypes.c_long(x) for x in a]), _ctypes.get_errno())[1:]\n"
        f"_page = _c({mmap}, 0, 4096, 3, 0x22, -1, 0)[0]\n"
        f"print(_page > 0, _c({mmap}, 0, {64 * gib}, 3, 0x4022, -1, 0), _c({mmap}, 0, {2 * gib}, 3, 0x2022, -1, 0),"
        f" _c({mremap}, _page, 4096, {64 * gib}, 1))"
    )
    first, rest = env.run_code(code).strip().split(" ", 1)
    noreserve, locked, grown = (tuple(int(n) for n in part.strip("()").split(", ")) for part in rest.split(") ("))
    # A locked mapping meets RLIMIT_MEMLOCK first (EAGAIN), or the address-space limit (ENOMEM).
    assert (first, noreserve, grown) == ("True", (-1, errno.ENOMEM), (-1, errno.ENOMEM)), rest
    assert locked in ((-1, errno.EAGAIN), (-1, errno.ENOMEM)), rest


def test_code_cannot_make_executable_memory(env, attacked):
    mmap, mprotect = _nr("mmap"), _nr("mprotect")
    code = (
        f"_m = _libc.syscall(_ctypes.c_long({mmap}), _ctypes.c_long(0), _ctypes.c_long(4096), _ctypes.c_long(3), "
        "_ctypes.c_long(0x22), _ctypes.c_long(-1), _ctypes.c_long(0))\n"
        f"print(_m != -1, _libc.syscall(_ctypes.c_long({mprotect}), _ctypes.c_long(_m), _ctypes.c_long(4096), "
        "_ctypes.c_long(5)), _ctypes.get_errno())"
    )
    assert env.run_code(code).split() == ["True", "-1", str(errno.EPERM)]


def test_no_syscall_tells_whether_a_path_exists(env, attacked, tmp_path):
    """The issue's oracle (getxattrat told whether a later month's parquet file existed): every
    path-inspecting call answers the same for a file that exists and one that does not."""
    present, absent = tmp_path / "month=2099-01.parquet", tmp_path / "month=2099-02.parquet"
    present.write_bytes(b"PAR1")
    calls = [
        ("getxattr", ["P:{}", "P:user.mirai", "B:64", 64]),
        ("getxattrat", [AT_FDCWD, "P:{}", 0, "P:user.mirai", "B:16", 16]),
        ("listxattr", ["P:{}", "B:256", 256]),
        ("newfstatat", [AT_FDCWD, "P:{}", "B:256", 0]),
        ("statx", [AT_FDCWD, "P:{}", 0, 0x7FF, "B:256"]),
        ("faccessat2", [AT_FDCWD, "P:{}", 0, 0]),
        ("openat", [AT_FDCWD, "P:{}", 0]),
    ]
    attacks = [
        (f"{name}:{which}", _nr(name), [a.format(path) if isinstance(a, str) else a for a in args])
        for name, args in calls
        if not (name in PROBED and _unknown_to_kernel(name))
        for which, path in (("present", present), ("absent", absent))
    ]
    answers = {}
    for line in env.run_code(f"ATTACKS = {attacks!r}\n" + RUN_ATTACKS).splitlines():
        label, rc, err = line.split()
        answers[label] = (int(rc), int(err))
    assert len(answers) == len(attacks) > 0, answers
    for name, _ in calls:
        if f"{name}:present" in answers:
            assert answers[f"{name}:present"] == answers[f"{name}:absent"] == (-1, errno.EPERM), (name, answers)


def test_the_lockdown_report_names_every_layer(env):
    report = env.run_code("1") and env.sandbox_report
    assert report["seccomp"].startswith("allowlist"), report
    assert not report["landlock"].startswith("unavailable") or "ABI 0" in report["landlock"], report
    if namespaces_here() == NAMESPACES:
        assert report["namespaces"] == NAMESPACES and report["empty_root"].startswith("an empty"), report
    else:
        assert report["namespaces"].startswith("unavailable") and report["empty_root"].startswith("unavailable"), report


# --- each kernel layer on its own -----------------------------------------------------------------


def _run_python(code: str, namespaces: bool = False) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter; with ``namespaces``, after lockdown.enter_namespaces (then
    a fork: the PID namespace holds the children forked after it, as in the sandbox)."""
    if namespaces:
        code = f"""
        import os
        from pipeline.agent_api.lockdown import NAMESPACES, enter_namespaces
        assert enter_namespaces() == NAMESPACES
        if os.fork():
            os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
        {textwrap.indent(textwrap.dedent(code), " " * 8).strip()}
        """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.skipif(namespaces_here() != NAMESPACES, reason=f"no namespaces here: {namespaces_here()}")
def test_ipc_namespace_alone_lets_no_segment_outlive_the_child():
    """Without seccomp, a child started the way the sandbox starts it creates a SysV segment; it
    is gone with the child, and the host never saw it."""
    out = _run_python(
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(0, {PROBE_SEGMENT}, 0o1600)
        print(shmid >= 0, '{PROBE_SEGMENT}' in open('/proc/sysvipc/shm').read())
    """,
        namespaces=True,
    )
    assert out.stdout.split() == ["True", "True"], out.stderr
    assert _host_segments(PROBE_SEGMENT) == []


@pytest.mark.skipif(namespaces_here() != NAMESPACES, reason=f"no namespaces here: {namespaces_here()}")
def test_the_empty_root_alone_hides_every_path(tmp_path):
    """Without Landlock or seccomp, a child started the way the sandbox starts it sees an empty,
    read-only root after enter_empty_root, and cannot undo it; the host's directory is untouched."""
    (tmp_path / "keep.txt").write_text("keep")
    out = _run_python(
        f"""
        import os
        from pipeline.agent_api.lockdown import enter_empty_root
        print(enter_empty_root({os.readlink("/proc/self/ns/mnt")!r}).startswith('an empty'))
        print(os.listdir('/'), os.path.exists({str(tmp_path / "keep.txt")!r}), os.path.exists('/etc/passwd'))
        for call in (lambda: open('/planted', 'w'), lambda: os.mkdir('/planted'), lambda: os.chroot('/')):
            try:
                call()
                print('allowed')
            except OSError as exc:
                print(type(exc).__name__)
    """,
        namespaces=True,
    )
    assert out.stdout.split() == ["True", "[]", "False", "False", "OSError", "OSError", "PermissionError"], (
        out.stdout + out.stderr
    )
    assert (tmp_path / "keep.txt").read_text() == "keep"
    assert os.path.exists("/etc/passwd")


def test_the_empty_root_is_never_mounted_in_the_parents_mount_namespace():
    """Run as root with no namespace of its own, the child must not cover the host's directory."""
    from pipeline.agent_api.lockdown import enter_empty_root

    mounts = Path("/proc/self/mountinfo").read_text()
    assert enter_empty_root(os.readlink("/proc/self/ns/mnt")).startswith("unavailable")
    assert enter_empty_root(None).startswith("unavailable")
    assert Path("/proc/self/mountinfo").read_text() == mounts
    assert os.readlink("/proc/self/root") == "/" and Path("/etc/passwd").exists()  # the root did not move


def test_landlock_alone_refuses_every_path(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("keep")
    out = _run_python(f"""
        from pipeline.agent_api.lockdown import _Landlock
        layer = _Landlock()
        if layer.abi < 1:
            print('no-landlock')
            raise SystemExit
        print(layer.enforce().split(':')[0])
        for call in (lambda: open({str(target)!r}).read(), lambda: open({str(target)!r}, 'w'),
                     lambda: __import__('os').listdir('/'), lambda: __import__('os').unlink({str(target)!r})):
            try:
                call()
                print('allowed')
            except PermissionError:
                print('denied')
    """)
    if out.stdout.strip() == "no-landlock":
        pytest.skip("this kernel has no Landlock")
    assert out.stdout.split()[2:] == ["denied"] * 4, out.stdout + out.stderr
    assert target.read_text() == "keep"


def test_reply_cap_is_the_observation_cap():
    """An observation at the cap, every character escaped as a surrogate pair, still fits."""
    assert len(json.dumps({"id": 2**31, "output": "\U0001f600" * MAX_OUTPUT_CHARS})) < REPLY_CAP_BYTES


# --- the reply pipe -------------------------------------------------------------------------------

# After BYPASS: write straight to the reply pipe (fd 1), as the child's first request (id 1).
FORGE = (
    "_os = _sys.modules['os']\ndef _forge(data, claimed=None):\n"
    "    _os.write(1, (len(data) if claimed is None else claimed).to_bytes(4, 'big') + data)\n"
)
FORGERIES = {
    "wrong type": '_forge(b\'{"id": 1, "output": 123}\')',
    "wrong length": '_forge(b\'{"id": 1, "output": "x"}\', claimed=50)',
    "100 MB": "_forge(b'', claimed=100 * 2**20)\nwhile True:\n    _os.write(1, b'x' * 2**20)",
    "not an object": "_forge(b'[1, 2, 3]')",
    "out of order": '_forge(b\'{"id": 2, "output": "the answer to a request not yet made"}\')',
    "extra keys": '_forge(b\'{"id": 1, "output": "x", "ready": {}}\')',
    "too deep": "_forge(b'[' * 100000)",
    "not UTF-8": '_forge(b\'{"id": 1, "output": "\\xff\\xfe"}\')',
    "an output over the cap": "_forge(_sys.modules['json'].dumps({'id': 1, 'output': 'x' * 30000}).encode())",
    "two replies": '_forge(b\'{"id": 1, "output": "forged"}\')',
}


@pytest.fixture
def fresh_env(env):
    """The module's environment with a child of its own for each test (forging kills it anyway)."""
    env.close()
    yield env
    env.close()


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_reply_is_an_error_observation_and_the_next_block_runs(fresh_env, forgery):
    observation = fresh_env.run_code(BYPASS + FORGE + FORGERIES[forgery], timeout_s=20)
    if forgery == "two replies":
        # A well-formed reply with the right number is just output the agent chose to print; the
        # genuine reply then waits on the pipe and the next request finds it there.
        assert observation == "forged"
        observation = fresh_env.run_code("count_events()")
    assert observation.startswith("SandboxError: the sandbox process broke the reply protocol"), observation
    assert "variables defined earlier are gone" in observation
    assert fresh_env.run_code("count_events()").strip() == str(fresh_env.count_events())


def test_an_output_with_a_lone_surrogate_is_valid_text(fresh_env):
    """print('\\ud800') reaches the parent as JSON; the observation must still encode as UTF-8 (the
    LLM request carries it), so the surrogate is shown escaped."""
    observation = fresh_env.run_code("print('a\\ud800b')", timeout_s=20)
    assert observation.encode("utf-8") == b"a\\ud800b\n", observation


def test_a_child_that_stops_reading_cannot_hang_the_parent(fresh_env):
    """The block answers its own request with a forged reply and then never reads again; the next
    request (larger than a pipe buffer) meets the block's deadline instead of blocking forever."""
    stall = '_forge(b\'{"id": 1, "output": "done"}\')\nwhile True:\n    _sys.modules[\'time\'].sleep(1)'
    assert fresh_env.run_code(BYPASS + FORGE + stall) == "done"
    big = "x = 1  # " + "y" * 300_000
    assert fresh_env.run_code(big, timeout_s=3).startswith("TimeoutError")
    assert fresh_env.run_code("count_events()").strip() == str(fresh_env.count_events())


def test_a_reply_that_drips_meets_the_deadline(fresh_env):
    """A well-formed reply sent one byte every quarter second (7 s in all): the block's deadline
    holds for the whole reply, not per read."""
    drip = (
        '_r = b\'{"id": 1, "output": "late"}\'\n_os.write(1, len(_r).to_bytes(4, \'big\'))\n'
        "for _b in _r:\n    _os.write(1, bytes([_b]))\n    _sys.modules['time'].sleep(0.25)"
    )
    assert fresh_env.run_code(BYPASS + FORGE + drip, timeout_s=1).startswith("TimeoutError")
    assert fresh_env.run_code("count_events()").strip() == str(fresh_env.count_events())


def test_the_observation_says_how_the_child_ended(fresh_env):
    """The sandbox child's own exit code or signal, reported by the process that waits for it
    (sandbox_child.fork_spare), not that waiter's."""
    assert "(exit code 7)" in fresh_env.run_code(BYPASS + "_sys.modules['os']._exit(7)")
    # The x32 ABI is outside the filter's architecture: the kernel kills the process (SIGSYS).
    if machine() == "x86_64":
        assert "(killed by signal 31)" in fresh_env.run_code(BYPASS + "_libc.syscall(_ctypes.c_long(0x40000000 | 39))")
    assert fresh_env.run_code("count_events()").strip() == str(fresh_env.count_events())


def test_the_reply_cap_is_exact(fresh_env):
    """A reply padded to exactly REPLY_CAP_BYTES is accepted; one byte more is refused unread.
    (The forging child exits, so that its genuine reply does not follow.)"""
    pad = '_r = b\'{"id": 1, "output": "at the cap"}\'\n_forge(_r + b\' \' * (%d - len(_r)))\n'
    assert fresh_env.run_code(BYPASS + FORGE + pad % REPLY_CAP_BYTES + "_os._exit(0)") == "at the cap"
    assert fresh_env.run_code("1").startswith("SandboxError: the code block ended the sandbox process")
    assert fresh_env.run_code(BYPASS + FORGE + pad % (REPLY_CAP_BYTES + 1)).startswith(
        f"SandboxError: the sandbox process broke the reply protocol (a reply of {REPLY_CAP_BYTES + 1} bytes"
    )


def test_stderr_cannot_grow_past_its_limit(fresh_env):
    """The child's stderr is a file on the host: writing 4 MiB, then seeking to 10 MiB and writing,
    ends at RLIMIT_FSIZE (EFBIG) with exactly STDERR_LIMIT bytes written."""
    flood = (
        "_n = 0\ntry:\n    for _ in range(64):\n        _n += _os.write(2, b'e' * 2**16)\n"
        "except OSError as _exc:\n    print(_exc.errno, _n)\n_os.lseek(2, 10 * 2**20, 0)\ntry:\n"
        "    _os.write(2, b'z')\nexcept OSError as _exc:\n    print(_exc.errno)"
    )
    assert fresh_env.run_code(BYPASS + "_os = _sys.modules['os']\n" + flood).split()[-3:] == [
        str(errno.EFBIG),
        str(STDERR_LIMIT),
        str(errno.EFBIG),
    ]


class _Scripted:
    """A chat client that replies from a script (zero think time)."""

    def __init__(self, replies):
        self.replies = list(replies)

    def chat(self, messages, *, temperature, max_tokens, stop):
        from pipeline.evaluation.llm import Reply

        return Reply(self.replies.pop(0), tokens_in=1, tokens_out=1, latency_s=0.0)


def test_forged_replies_end_as_error_observations_and_the_evaluation_completes(tmp_path):
    """Query 1's agent forges three replies (wrong type, wrong length, 100 MB); each is an error
    observation, its sandbox is replaced, and query 2 is answered as usual. The record and every
    trajectory name the sandbox's layers."""
    import polars as pl

    from pipeline.evaluation.registry import Agent
    from pipeline.evaluation.run import evaluate_agent
    from pipeline.storage import DataLayout

    generate_event_database(tmp_path, date(2024, 1, 1), 2, seed=3, quads_per_day=20)
    split = pl.DataFrame(
        {
            "query_id": ["2024-02-00001", "2024-02-00002"],
            "date": [date(2024, 2, 10), date(2024, 2, 11)],
            "s": ["USA", "RUS"],
            "o": ["CHN", "UKR"],
            "answer_dict": ['{"04": ["042"]}', '{"19": ["190"]}'],
        }
    )
    agent = Agent(
        name="forger",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=1,
        gguf=tmp_path / "none.gguf",
        strategy="react",
        action_type="code_block",
        temperature=0.0,
        max_steps=6,
    )
    block = "Action:\n```python\n{}\n```"
    forged = [block.format(BYPASS + FORGE + FORGERIES[k]) for k in ("wrong type", "wrong length", "100 MB")]
    count = block.format("print(count_events())")
    # Never three errors in a row, which would end the episode (MIRAI D.1).
    replies = [
        forged[0],
        forged[1],
        count,
        forged[2],
        'Final Answer: {"04": ["042"]}',
        count,
        'Final Answer: {"19": ["190"]}',
    ]
    results, record = evaluate_agent(split, tmp_path, agent, 1, client=_Scripted(replies), query_set="t")
    directory = DataLayout(tmp_path).evaluation_dir(date(2024, 2, 1), "forger", "t", 1)
    lines = [json.loads(line) for line in (directory / "trajectories.jsonl").read_text().splitlines()]
    first, second = lines
    observations = [step["observation"] for step in first["steps"] if step["observation"] is not None]
    assert [o.startswith("SandboxError: the sandbox process broke the reply protocol") for o in observations] == [
        True,
        True,
        False,
        True,
    ]
    assert int(observations[2]) > 0
    assert record["end_states"] == {"final_answer": 2}
    assert int(second["steps"][0]["observation"]) > 0
    assert record["sandbox"] == [first["sandbox"]] == [second["sandbox"]]
    assert record["sandbox"][0]["seccomp"].startswith("allowlist")
    assert results.height == 2


# Numbers no filter rule decides: the x32 ABI (the filter kills the process), and uretprobe and
# uprobe, which the kernel lets through every seccomp filter (kernel/seccomp.c,
# seccomp_uprobe_exception) and which, called from anywhere but a uprobe trampoline, end the caller
# with SIGILL or fail. None may return success; the next block gets a fresh sandbox.
UNFILTERED = {"x32 getpid": 0x40000000 | 39, "uretprobe": 335, "uprobe": 336}


@pytest.mark.skipif(machine() != "x86_64", reason="x32, uretprobe and uprobe are x86_64 numbers")
@pytest.mark.parametrize("label", list(UNFILTERED))
def test_calls_outside_the_filter_only_end_the_child(fresh_env, label):
    observation = fresh_env.run_code(BYPASS + f"print('rc', _libc.syscall(_ctypes.c_long({UNFILTERED[label]})))")
    assert observation.startswith("SandboxError: the code block ended the sandbox process") or observation.split()[
        -2:
    ] == ["rc", "-1"], observation
    assert fresh_env.run_code("count_events()").strip() == str(fresh_env.count_events())
