"""Sandboxes of different cutoffs never run at the same moment (docs/agent_api.md, "Concurrent
episodes").

Two sandboxes that run at once share the machine: its CPUs and caches, and every kernel lock their
mappings share (a file's i_mmap lock, which mprotect takes when it splits a mapping of libpython;
the anon_vma of memory inherited from the template). Contention on any of them is a timing channel
from an episode with a late cutoff to one with an early cutoff, and seccomp cannot tell such calls
from an allocator's own. The gate closes them all at once: a sandbox child runs only while its
parent holds the gate for the child's cutoff (sandbox.py stops it with SIGSTOP, which it can neither
catch nor block, between blocks). Sandboxes of one cutoff see the same tables and may run together.

Machine-wide for one user: one lock file per cutoff in a directory of that user's, held shared
(flock(2)) by every running block of that cutoff. A block takes the directory's turn lock, waits
until no other cutoff's file is held, takes its own and gives the turn back; a block of another
cutoff waiting for its turn therefore holds back new blocks of the running cutoff, so no cutoff
starves. flock locks belong to an open file, so threads of one evaluation exclude each other as
processes do, and the kernel drops every lock of a process that dies: a killed evaluation never
holds the gate.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

TURN_FILE = "turn.lock"
SUFFIX = ".cutoff.lock"


class GateError(RuntimeError):
    """The gate's directory is not one this user alone can write."""


def default_directory() -> Path:
    """This user's gate on this machine: every evaluation the user runs shares it."""
    return Path(tempfile.gettempdir()) / f"mirai-sandbox-gate-{os.geteuid()}"


class CutoffGate:
    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory is not None else default_directory()

    def _checked_directory(self) -> int:
        """A descriptor of the directory, made 0700 if missing. Another user's directory, or one
        others may write, would let them hold or forge locks: refused."""
        try:
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            pass
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (NotADirectoryError, OSError) as exc:  # a link (ELOOP) or a file where it should be
            raise GateError(f"the sandbox gate {self.directory} is not a directory: {exc.strerror}") from None
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            os.close(fd)
            raise GateError(
                f"the sandbox gate {self.directory} belongs to uid {info.st_uid} with mode "
                f"{stat.S_IMODE(info.st_mode):o}: it must be this user's ({os.geteuid()}) and 0700"
            )
        return fd

    @contextmanager
    def hold(self, cutoff: date) -> Iterator[float]:
        """Held while a block of ``cutoff`` runs; yields the seconds it waited for its turn."""
        started = time.monotonic()
        directory = self._checked_directory()
        try:
            turn = _open_lock(directory, TURN_FILE)
            try:
                fcntl.flock(turn, fcntl.LOCK_EX)
                own_name = cutoff.isoformat() + SUFFIX
                for name in os.listdir(directory):
                    if name.endswith(SUFFIX) and name != own_name:
                        _wait_free_and_remove(directory, name)
                own = _open_lock(directory, own_name)
                fcntl.flock(own, fcntl.LOCK_SH)
            finally:
                os.close(turn)  # closing the only descriptor of the turn lock releases it
        finally:
            os.close(directory)
        try:
            yield time.monotonic() - started
        finally:
            os.close(own)


def _open_lock(directory: int, name: str) -> int:
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory)


def _wait_free_and_remove(directory: int, name: str) -> None:
    """Until no block of that cutoff runs. With the turn held no one can take the file anew, so once
    free it is removed: the directory holds the running cutoffs' files only."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.unlink(name, dir_fd=directory)
    finally:
        os.close(fd)


CUTOFF_GATE = CutoffGate()
