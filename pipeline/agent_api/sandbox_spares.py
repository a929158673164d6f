"""The warm spares sandbox children start from (docs/agent_api.md, "Warm spares"): a template
process per set of libraries that has done the imports and holds nothing else
(sandbox_child.serve_template), and the pool of children forked from it ahead of need, each waiting,
with no table and no code, for one episode (sandbox.py hands it one). This module only starts,
keeps and stops them; what a spare becomes once handed an episode is sandbox.py's.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from pipeline.agent_api.sandbox_protocol import FORK, FORKED, WARM

START_TIMEOUT_S = 120.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# The whole environment of a template, hence of every sandbox child forked from it.
CHILD_ENVIRONMENT = {
    "PYTHONPATH": str(PROJECT_ROOT),
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    # One BLAS/OpenMP thread: numpy would start one per core at import, for matrices far larger
    # than a code block's; they would cost start time and address space.
    **dict.fromkeys(BLAS_THREAD_VARIABLES, "1"),
}


class SandboxError(RuntimeError):
    """The child could not be started, or code blocks are refused on this platform."""


class ProtocolError(Exception):
    """The child wrote something that is not the reply it owed (wrong shape, size or order)."""


class _Template:
    """The template process of one set of libraries (sandbox_child.serve_template): it imports once
    and forks every spare of that set, so a spare costs a fork and the API's warm-up instead of an
    interpreter's start and imports. It holds no table, no configuration and no code, runs no
    agent code and is reached only through its control socket, by this process."""

    def __init__(self, libraries: tuple[str, ...]):
        self.libraries = libraries
        self._lock = threading.Lock()  # one fork at a time on the control socket
        self._stop_lock = threading.Lock()
        self._ended: str | None = None
        self._warm = False
        self.channel, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline.agent_api.sandbox_child",
                    f"--libraries={','.join(libraries)}",
                    f"--control={child_end.fileno()}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                cwd="/",
                # Every other descriptor of this process (children's pipes and table files
                # included) is closed in the template.
                close_fds=True,
                pass_fds=(child_end.fileno(),),
                env=CHILD_ENVIRONMENT,
                # A session of its own, so of its spares and sandbox children too: a SIGCONT to this
                # process's group (a shell's fg or bg, GNU timeout, the kernel's orphaned-group rule)
                # must not resume children stopped between blocks (cutoff_gate.py). It ends when its
                # control socket closes, so it needs no signal from the terminal.
                start_new_session=True,
            )
        except OSError as exc:
            self.channel.close()
            self.stderr.close()
            raise SandboxError(f"the sandbox template could not be started: {exc}") from exc
        finally:
            child_end.close()

    def fork(self, descriptors: list[int]) -> int:
        """A pidfd of a child forked with ``descriptors`` (sandbox_protocol.SPARE_DESCRIPTORS);
        OSError, EOFError, TimeoutError or ProtocolError if the template died, stalls or answers
        anything else. The first call waits for the template's imports."""
        with self._lock:
            self.channel.settimeout(START_TIMEOUT_S)
            if not self._warm:
                message = self.channel.recv(len(WARM) + 1)
                if message != WARM:
                    raise (
                        EOFError("the template ended during its imports")
                        if not message
                        else ProtocolError("the template's first message is not the warm signal")
                    )
                self._warm = True
            socket.send_fds(self.channel, [FORK], descriptors)
            message, fds, flags, _ = socket.recv_fds(self.channel, len(FORKED) + 1, 1)
            if message != FORKED or len(fds) != 1 or flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                raise EOFError("the template ended") if not message else ProtocolError("not a forked child's pidfd")
            return fds[0]

    def stop(self) -> str:
        """Kill the template (the children it forked for spares die with it); how it ended and
        the tail of its stderr. Safe to call from several threads and more than once (the pool's
        close at exit can meet a failed fork stopping the same template): the first stops it,
        every call returns the same account."""
        with self._stop_lock:
            if self._ended is None:
                if self.proc.poll() is None:
                    self.proc.kill()
                code = self.proc.wait()
                # A fork in progress holds the lock; the template's death ends its wait (EOF), so
                # the channel is closed only once no thread is reading it.
                with self._lock:
                    self.channel.close()
                self._ended = "template " + how_it_ended(code, self.stderr)
            return self._ended


def how_it_ended(code: int, stderr) -> str:
    """A process's exit code or signal and the tail of its stderr file (which is closed), for
    error messages. At interpreter exit the file may have been finalised first: no tail then."""
    tail = ""
    if not stderr.closed:
        stderr.seek(0)
        tail = stderr.read()[-2000:].decode(errors="replace").strip()
        stderr.close()
    ended = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return ended + (f"; stderr: {tail}" if tail else "")


def _pid_of(pidfd: int) -> int:
    """The process id a pidfd refers to, in this process's PID namespace (proc(5), fdinfo)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as fh:
        for line in fh:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise OSError(f"no Pid in the fdinfo of pidfd {pidfd}")


class _ForkedProcess:
    """A spare's process as this process sees it (sandbox_child.fork_spare): the template's child
    that waits for the sandbox child, reached through a pidfd, with the sandbox child's pipes. Only
    the template may wait for it, so its exit code, the sandbox child's, comes over a status pipe:
    none means it was killed (SIGKILL from here, or its parent's death)."""

    def __init__(self, pidfd: int, stdin_fd: int, stdout_fd: int, status_fd: int):
        self._pidfd, self._status = pidfd, status_fd
        try:
            self.pid = _pid_of(pidfd)
        except OSError:
            os.close(pidfd)
            raise
        self.stdin = open(stdin_fd, "wb", buffering=0)  # kept for the child's lifetime
        self.stdout = open(stdout_fd, "rb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._collect()
        return self.returncode

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None if the process still runs after ``timeout_s``."""
        if self.returncode is None and select.select([self._pidfd], [], [], timeout_s)[0]:
            self._collect()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _collect(self) -> None:
        try:
            text = os.read(self._status, 16).strip()
        finally:
            os.close(self._status)
            os.close(self._pidfd)
        self.returncode = int(text) if text.lstrip(b"-").isdigit() else -signal.SIGKILL


class Spare:
    """A child forked from its libraries' template (sandbox_child.fork_spare), warming up, not yet
    given any episode: no table, no configuration, no code. Its only descriptors are its pipes,
    its stderr file and the socket an episode arrives on, which it closes on arrival."""

    def __init__(self, template: _Template):
        self.libraries = template.libraries
        self._warm_lock = threading.Lock()
        self.warm = False
        # SOCK_SEQPACKET: message boundaries, so the configuration and each part's descriptors
        # (SCM_RIGHTS, unix(7)) arrive as sent.
        self.channel, handover = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Kept for the child's lifetime (closed in _Child.stop), so not a with-block.
        self.stderr = tempfile.TemporaryFile()
        (stdin_r, stdin_w), (stdout_r, stdout_w), (status_r, status_w) = os.pipe(), os.pipe(), os.pipe()
        try:
            pidfd = template.fork([stdin_r, stdout_w, self.stderr.fileno(), handover.fileno(), status_w])
            self.proc = _ForkedProcess(pidfd, stdin_w, stdout_r, status_r)
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            for fd in (stdin_w, stdout_r, status_r):
                os.close(fd)
            self.channel.close()
            self.stderr.close()
            raise SandboxError(f"the sandbox process could not be started: {exc}") from exc
        finally:
            for fd in (stdin_r, stdout_w, status_w):
                os.close(fd)
            handover.close()

    def wait_warm(self, timeout_s: float) -> None:
        """Until the child says its warm-up is done (sandbox_protocol.WARM); OSError, EOFError,
        TimeoutError or ProtocolError if it dies, stalls or says anything else. Called by the
        pool's starter and by the episode that takes the spare, whichever comes first."""
        with self._warm_lock:
            if self.warm:
                return
            self.channel.settimeout(timeout_s)
            message = self.channel.recv(len(WARM) + 1)
            if not message:
                raise EOFError("the spare ended before its warm-up was done")
            if message != WARM:
                raise ProtocolError("the spare's first message is not the warm signal")
            self.warm = True

    def stop(self, ended_s: float = 0.0) -> str:
        """Kill the child (a spare's, or the one sandbox.py made of it); how it ended and the tail of
        its stderr (for error messages). ``ended_s``: how long to wait first for a child that closed
        its pipe (it is ending: its waiter then reports its exit code, which a kill would replace)."""
        if self.proc.poll() is None and (ended_s <= 0 or self.proc.wait(ended_s) is None):
            self.proc.kill()
        code = self.proc.wait()
        self.close_channel()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return how_it_ended(code, self.stderr)

    def close_channel(self) -> None:
        """Close the handover socket once the child has ended: the pool's starter may still be
        in wait_warm on it (a spare stopped as surplus, or at exit), and the child's end closing
        is what ends that wait, so no thread reads a descriptor closed (and maybe reused) under it."""
        with self._warm_lock:
            self.channel.close()


class SparePool:
    """Warm spares per set of libraries in this process (docs/agent_api.md, "Warm spares"), so
    that an episode's start skips the interpreter's start and imports. One waits per set of
    libraries in use; an evaluation ``reserve``s as many as its episodes run at once. A starter
    thread keeps each set at its number, starting one spare at a time and the next only once
    that one has imported (so spares never take both cores from running episodes), none while an
    episode waits for its own child's imports (a spare taken before it was warm, or one started on
    the spot when none waited), and a taken spare's successor only once the taken one has started
    (so the two do not compete for the CPU during an episode's start). Each spare serves exactly one episode and is then stopped like any
    child; nothing passes from one episode to the next. Spares are stopped at interpreter exit
    (and die with this process: their stdin closes)."""

    def __init__(self):
        self._lock = threading.Condition()
        self._waiting: dict[tuple[str, ...], list[Spare]] = {}  # oldest first
        self._wanted: dict[tuple[str, ...], int] = {}  # spares to keep waiting per set
        self._reserved: dict[tuple[str, ...], list[int]] = {}  # evaluations' reservations per set
        self._templates: dict[tuple[str, ...], _Template] = {}
        self._starter: threading.Thread | None = None
        self._closed = False
        self._episodes_importing = 0  # episodes waiting for their own child's imports (wait_warm)

    def take(self, libraries: tuple[str, ...]) -> Spare:
        """The oldest spare for ``libraries`` that is alive (warm, or the closest to it), started
        now if there is none."""
        with self._lock:
            self._wanted.setdefault(libraries, 1)
            waiting = self._waiting.get(libraries, [])
            spare = waiting.pop(0) if waiting else None
        if spare is not None and spare.proc.poll() is not None:
            spare.stop()
            return self.take(libraries)
        return spare or self._spawn(libraries)

    def _spawn(self, libraries: tuple[str, ...]) -> Spare:
        """A new spare forked from ``libraries``' template (started now if it is not running; a
        template that failed to fork is stopped, so the next spare gets a fresh one)."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed (this process is exiting)")
            template = self._templates.get(libraries)
            if template is None or template.proc.poll() is not None:
                template = self._templates[libraries] = _Template(libraries)
        try:
            return Spare(template)
        except SandboxError as exc:
            with self._lock:
                if self._templates.get(libraries) is template:
                    del self._templates[libraries]
            raise SandboxError(f"{exc}; {template.stop()}") from exc

    def wait_warm(self, spare: Spare) -> None:
        """Until a taken spare's imports are done (Spare.wait_warm). While an episode waits so,
        the starter starts no spare: the episode's child imports alone, as it would without spares."""
        if spare.warm:
            return
        with self._lock:
            self._episodes_importing += 1
        try:
            spare.wait_warm(START_TIMEOUT_S)
        finally:
            with self._lock:
                self._episodes_importing -= 1
                self._lock.notify_all()

    def started(self, libraries: tuple[str, ...]) -> None:
        """A taken spare has started its episode: its successor may be started now."""
        self._wake()

    def reserve(self, libraries: tuple[str, ...], n: int) -> None:
        """Keep ``n`` spares for ``libraries`` waiting (at least the one any set in use keeps),
        until ``release(libraries, n)``; overlapping reservations add up."""
        self.resize(libraries, None, n)

    def resize(self, libraries: tuple[str, ...], old: int | None, new: int | None) -> None:
        """Change a reservation of ``old`` spares to ``new`` (None: none), stopping spares no
        longer wanted, so that a run keeps no more than it can still use."""
        with self._lock:
            reserved = self._reserved.setdefault(libraries, [])
            if old is not None:
                reserved.remove(old)
            if new is not None:
                reserved.append(new)
            wanted = self._wanted[libraries] = max(1, sum(reserved))
            waiting = self._waiting.get(libraries, [])
            surplus = waiting[wanted:]
            del waiting[wanted:]
        for spare in surplus:
            spare.stop()
        self._wake()

    def release(self, libraries: tuple[str, ...], n: int) -> None:
        """End a reservation: spares beyond what is still wanted are stopped."""
        self.resize(libraries, n, None)

    def _wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._starter is None or not self._starter.is_alive():
                self._starter = threading.Thread(target=self._start_spares, name="sandbox-spares", daemon=True)
                self._starter.start()
            self._lock.notify_all()

    def _short(self) -> tuple[str, ...] | None:
        """A set of libraries with fewer spares waiting than wanted (the emptiest first)."""
        short = [(len(self._waiting.get(libs, [])) - n, libs) for libs, n in self._wanted.items()]
        short = [item for item in short if item[0] < 0]
        return min(short)[1] if short else None

    def _start_spares(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (self._episodes_importing or (libraries := self._short()) is None):
                    self._lock.wait()
                if self._closed:
                    return
            try:
                spare = self._spawn(libraries)
            except SandboxError:
                return  # the next take starts one, or says why it cannot
            with self._lock:
                if self._closed:
                    spare.stop()
                    return
                self._waiting.setdefault(libraries, []).append(spare)
            try:
                spare.wait_warm(START_TIMEOUT_S)
            except (OSError, EOFError, TimeoutError, ProtocolError):
                pass  # a spare that died is found by take() and replaced

    def renew(self) -> None:
        """Stop every spare waiting; the starter starts their successors. At a handover from a later
        cutoff to an earlier one (cutoff_gate.py): a spare that warmed up while the later cutoff's
        sandboxes ran carries how long that took in its own CPU clock, which its episode may read."""
        with self._lock:
            spares = [spare for waiting in self._waiting.values() for spare in waiting]
            for waiting in self._waiting.values():
                waiting.clear()
        for spare in spares:
            spare.stop()
        self._wake()

    def pids(self) -> list[int]:
        """The process ids of the spares waiting (the tests attack them)."""
        with self._lock:
            return [spare.proc.pid for spares in self._waiting.values() for spare in spares]

    def waiting(self, libraries: tuple[str, ...]) -> list[tuple[int, bool]]:
        """(process id, imports done) of each spare waiting for ``libraries``, oldest first."""
        with self._lock:
            return [(spare.proc.pid, spare.warm) for spare in self._waiting.get(libraries, [])]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares = [spare for waiting in self._waiting.values() for spare in waiting]
            templates = list(self._templates.values())
            self._waiting, self._templates = {}, {}
            self._lock.notify_all()
        for spare in spares:
            spare.stop()
        for template in templates:
            template.stop()

    def _forget(self) -> None:
        """In a forked copy of this process: the spares and templates are the parent's, not ours."""
        self.__init__()


SPARES = SparePool()
atexit.register(SPARES.close)
os.register_at_fork(after_in_child=SPARES._forget)
