"""Sandboxes of different cutoffs never exist at the same moment (docs/agent_api.md, "Concurrent
episodes").

Two sandboxes that run at once share the machine: its CPUs and caches, and every kernel lock their
mappings share (a file's i_mmap lock, which mprotect takes when it splits a mapping of libpython;
the anon_vma of memory inherited from the template). A stopped sandbox shares them too: the
kernel's tree of a file's mappings (i_mmap; anon_vma for memory inherited from the template) keeps
its mappings, and an early sandbox times its own splits of the same file slower in a larger tree
(a re-attack of issue 30). Any of them is a channel from an episode with a late cutoff to one with
an early cutoff, and seccomp cannot tell such calls from an allocator's own. The gate closes them
all at once: an episode's sandbox holds a lease of the gate for its cutoff from its first code
block until it is closed and its child is gone (sandbox.py), and runs only while it does. Episodes
of one cutoff see the same tables and may hold leases together.

Machine-wide for one user: one lock file per cutoff in a directory of that user's, held shared
(flock(2)) by every lease of that cutoff. A lease takes the directory's turn lock, waits until no
other cutoff's file is held, takes its own and gives the turn back; a lease of another cutoff
waiting for its turn therefore holds back new leases of the running cutoff, so no cutoff starves.
A thread that holds a lease may take more of the same cutoff at once (it must not wait for the
turn, which a waiter holds until that thread's episode ends), and none of another cutoff: it would
wait for itself (HeldByThisThread). flock locks belong to an open file, so threads of one
evaluation exclude each other as processes do, and the kernel drops every lock of a process that
dies: a killed evaluation never holds the gate.

A backward handover, from a later cutoff to an earlier one, is what only the order of two runs on
the machine brings about (inside a run the gate passes forward: evaluation/episodes.py). Two things
of the later sandboxes outlive them there, and the gate takes both away before the earlier cutoff
runs: the lines they loaded in the CPU's caches (swept, cpu_caches.py; the warm spares that
started beside them are replaced too, sandbox_spares.py) and the moment they ended,
which the earlier sandbox would read from its clock (it starts at the next multiple of the
handover grid of the wall clock instead, MIRAI_SANDBOX_HANDOVER_GRID_S, so a later agent sets at
most which multiple, by stalling: docs/agent_api.md, "The handover between cutoffs").
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

from pipeline.agent_api.cpu_caches import sweep_cpu_caches
from pipeline.agent_api.sandbox_spares import SPARES
from pipeline.config import SandboxSettings

TURN_FILE = "turn.lock"
SUFFIX = ".cutoff.lock"


class GateError(RuntimeError):
    """The gate's directory is not one this user alone can write, or a thread asked for a second
    cutoff while it holds one."""


class HeldByThisThread(GateError):
    """This thread holds a lease of another cutoff: waiting would wait for itself."""


def default_directory() -> Path:
    """This user's gate on this machine: every evaluation the user runs shares it. A fixed path,
    not TMPDIR's: two evaluations with different temporary directories would hold two gates (a
    re-attack of issue 30 ran blocks of two cutoffs at once that way). Containers that should be
    gated against each other share this directory (docs/deploy.md)."""
    return Path("/tmp") / f"mirai-sandbox-gate-{os.geteuid()}"


class Lease:
    """The gate held for one episode of ``cutoff`` (CutoffGate.lease); ``waited``: the seconds it
    waited for its turn. ``release`` gives it back, once, from any thread."""

    def __init__(self, gate: CutoffGate, cutoff: date, thread: int, descriptor: int, waited: float):
        self._gate, self.cutoff, self._thread, self._descriptor = gate, cutoff, thread, descriptor
        self.waited = waited
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._gate._forget(self.cutoff, self._thread, self._descriptor)


class CutoffGate:
    def __init__(self, directory: Path | None = None, handover_grid_s: float | None = None):
        """``handover_grid_s``: what a lease that names none waits for at a backward handover
        (default: the setting's declared default)."""
        self.directory = Path(directory) if directory is not None else default_directory()
        default = SandboxSettings.model_fields["handover_grid_s"].default
        self.handover_grid_s = default if handover_grid_s is None else handover_grid_s
        self._lock = threading.Lock()
        # Each thread's leases: the descriptors of the cutoff lock files they hold, by cutoff.
        self._by_thread: dict[int, dict[date, list[int]]] = {}

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

    def lease(self, cutoff: date, handover_grid_s: float | None = None) -> Lease:
        """Held from an episode's first code block until its sandbox is gone: waits until no other
        cutoff holds the gate, and at a backward handover for the next multiple of
        ``handover_grid_s`` (default the gate's). HeldByThisThread if the calling thread holds
        another cutoff's lease (it would wait for itself); a thread that holds this cutoff's joins
        at once, for the same reason."""
        started, thread = time.monotonic(), threading.get_ident()
        with self._lock:
            mine = self._by_thread.get(thread, {})
            other = next((held for held in mine if held != cutoff), None)
            if other is not None:
                raise HeldByThisThread(
                    f"this thread still runs an episode of cutoff {other}: close that environment "
                    f"(Environment.close() or a with-block) before a code block of cutoff {cutoff}"
                )
            if cutoff in mine:
                # Another descriptor of the open file this thread's lease locked: the lock lasts
                # until the last of them is closed, whichever lease is released first. (Opening
                # the file anew would race a release from another thread: a waiter could take and
                # remove the file in between.)
                descriptor = os.dup(mine[cutoff][0])
                mine[cutoff].append(descriptor)
                return Lease(self, cutoff, thread, descriptor, time.monotonic() - started)
        descriptor = self._take_turn(cutoff, self.handover_grid_s if handover_grid_s is None else handover_grid_s)
        with self._lock:
            self._by_thread.setdefault(thread, {}).setdefault(cutoff, []).append(descriptor)
        return Lease(self, cutoff, thread, descriptor, time.monotonic() - started)

    def _forget(self, cutoff: date, thread: int, descriptor: int) -> None:
        with self._lock:
            mine = self._by_thread[thread]
            mine[cutoff].remove(descriptor)
            os.close(descriptor)  # the lock goes with the open file's last descriptor
            if not mine[cutoff]:
                del mine[cutoff]
            if not mine:
                del self._by_thread[thread]

    @contextmanager
    def hold(self, cutoff: date, handover_grid_s: float | None = None) -> Iterator[float]:
        """A lease for the duration of a with-block; yields the seconds it waited for its turn."""
        lease = self.lease(cutoff, handover_grid_s)
        try:
            yield lease.waited
        finally:
            lease.release()

    def _take_turn(self, cutoff: date, handover_grid_s: float) -> int:
        """A descriptor of ``cutoff``'s lock file, locked shared, once no other cutoff holds one."""
        directory = self._checked_directory()
        try:
            turn = _open_lock(directory, TURN_FILE)
            try:
                fcntl.flock(turn, fcntl.LOCK_EX)
                own_name = cutoff.isoformat() + SUFFIX
                others = [name for name in os.listdir(directory) if name.endswith(SUFFIX) and name != own_name]
                for name in others:
                    _wait_free_and_remove(directory, name)
                if any(_cutoff_of(name) > cutoff for name in others):
                    _hand_backward(handover_grid_s)
                own = _open_lock(directory, own_name)
                fcntl.flock(own, fcntl.LOCK_SH)
                return own
            finally:
                os.close(turn)  # closing the only descriptor of the turn lock releases it
        finally:
            os.close(directory)


def _hand_backward(grid_s: float) -> None:
    """Every sandbox of the later cutoff is gone: wait for the grid's next multiple, sweep what
    they left in the CPU's caches, and replace this process's warm spares, which warmed up beside
    them."""
    if grid_s > 0:
        time.sleep(-time.time() % grid_s)
    sweep_cpu_caches()
    SPARES.renew()


def _cutoff_of(name: str) -> date:
    """The cutoff a lock file is named for; a name that is none counts as the latest (the gate's
    directory is this user's alone, so only a bug would put one there)."""
    try:
        return date.fromisoformat(name.removesuffix(SUFFIX))
    except ValueError:
        return date.max


def _open_lock(directory: int, name: str) -> int:
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory)


def _wait_free_and_remove(directory: int, name: str) -> None:
    """Until no lease of that cutoff is held. With the turn held no one can take the file anew, so
    once free it is removed: the directory holds the running cutoffs' files only."""
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
