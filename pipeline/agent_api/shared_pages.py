"""The file pages every sandbox maps, kept in memory while sandboxes may touch them.

Concurrent sandboxes map the same files: the libraries their interpreter loaded (polars alone is
130 MiB of code) and the month parts of the gated tables. Whether a page of such a file is in the
page cache is state they share: one sandbox touching a page that is not resident makes it
resident, and a sibling can tell a resident page (~0.5 µs to touch) from one that is not (40-70 µs),
so a late-cutoff episode could set bits an early-cutoff one reads (a re-attack of issue 30 moved 73
bits per trial). Reading every such page in once and locking it (mlock(2)) leaves the residency of
those pages nothing to vary: each is resident from before any agent code runs until it is released.

mlock needs CAP_IPC_LOCK or a memory-lock limit (RLIMIT_MEMLOCK) as large as what is kept. Where
the kernel refuses, the pages are still read in (so a page never read since the host started
carries no bit) but memory pressure may evict them; `status()` says which, and every evaluation
records it (docs/agent_api.md, "Other episodes are adversaries too").
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from pathlib import Path

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_POPULATE = 0x8000  # the same value on x86_64 and aarch64 (asm-generic/mman.h)
_MAP_FAILED = ctypes.c_void_p(-1).value
_PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

FileKey = tuple[int, int]  # (st_dev, st_ino)


class SharedPages:
    """Whole files mapped read-only, read in and locked, by (device, inode); each file once, at
    its size then (what is kept never grows: libraries, and table parts written once).
    Thread-safe: sandboxes start from several threads. What cannot be kept is said by `status()`
    rather than raised: residency is one defence among several, and a sandbox still starts."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept: dict[FileKey, tuple[int, int]] = {}  # key -> (length, address)
        self._refusal: str | None = None  # why mlock failed (then pages are read in, not locked)
        self._unkept: str | None = None  # why some pages could not even be read in

    def keep_file(self, path: Path) -> FileKey:
        """All of ``path``'s pages; returns its key, for `release`."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino)
            self._keep(fd, key, info.st_size)
        finally:
            os.close(fd)
        return key

    def keep_mapped_by(self, pid: int) -> None:
        """Every page of every regular file that process ``pid`` or a descendant maps (a spare's
        waiter forks the sandbox child, which imports more after the fork), as /proc/<pid>/maps
        lists them: whole files, not the mapped ranges, since a child can grow a mapping over the
        rest of its file (mremap) and touch pages no segment maps. Each file is opened through
        /proc/<pid>/map_files (the mapped file itself, even if replaced or deleted since), or by its
        path where that is not allowed (it needs CAP_SYS_ADMIN), checked by device and inode."""
        for process in process_tree(pid):
            self._keep_mapped_by_one(process)

    def _keep_mapped_by_one(self, pid: int) -> None:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError as exc:
            self._note_unkept(f"/proc/<pid>/maps unreadable ({errno.errorcode.get(exc.errno, exc.errno)})")
            return
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[4] == "0":
                continue
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            key = (os.makedev(major, minor), int(fields[4]))
            with self._lock:
                if key in self._kept:
                    continue  # every later child maps what the first one did: no file opened again
            fd = _open_mapped(pid, fields[0], fields[5].removesuffix(" (deleted)"), key)
            if fd is None:
                if fields[5].startswith("/"):
                    self._note_unkept(f"{fields[5]} could not be opened")
                continue
            try:
                self._keep(fd, key, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    def _keep(self, fd: int, key: FileKey, size: int) -> None:
        length = -(-size // _PAGE) * _PAGE
        with self._lock:
            if key in self._kept or length == 0:
                return
            address = _libc.mmap(None, length, _PROT_READ, _MAP_SHARED | _MAP_POPULATE, fd, 0)
            if address in (None, _MAP_FAILED):
                code = ctypes.get_errno()
                self._unkept = self._unkept or f"mmap refused ({errno.errorcode.get(code, code)})"
                return
            if self._refusal is None and _libc.mlock(address, length) != 0:
                code = ctypes.get_errno()
                self._refusal = errno.errorcode.get(code, str(code))
            self._kept[key] = (length, address)

    def _note_unkept(self, why: str) -> None:
        with self._lock:
            self._unkept = self._unkept or why

    def release(self, key: FileKey) -> None:
        """Unmap (and so unlock) the file ``key``."""
        with self._lock:
            kept = self._kept.pop(key, None)
            if kept is not None:
                _libc.munmap(kept[1], kept[0])

    def status(self) -> str:
        """What keeps the shared pages resident: the same words for every child of a process, so
        the layers an evaluation records stay one set."""
        if self._unkept is not None:
            return f"not all kept: {self._unkept}"
        if self._refusal is None:
            return "read in and locked in memory (mlock) while sandboxes map them"
        return (
            f"read in, not locked (mlock refused: {self._refusal}; needs CAP_IPC_LOCK or RLIMIT_MEMLOCK): "
            "memory pressure can evict them"
        )


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (/proc/<pid>/task/<tid>/children)."""
    tree, at = [pid], 0
    while at < len(tree):
        try:
            tasks = list(Path(f"/proc/{tree[at]}/task").iterdir())
        except OSError:
            tasks = []
        for task in tasks:
            try:
                tree += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
        at += 1
    return tree


def _open_mapped(pid: int, address_range: str, path: str, key: FileKey) -> int | None:
    """A read-only descriptor of the regular file with ``key`` that ``pid`` maps at
    ``address_range``; None if it is not a regular file or cannot be opened."""
    for candidate in (f"/proc/{pid}/map_files/{address_range}", path):
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == key:
            return fd
        os.close(fd)
    return None


SHARED_PAGES = SharedPages()
