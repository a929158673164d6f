"""Running agents' code blocks: one long-lived, locked-down child process per environment.

The agent's code is assumed to own the child's Python interpreter, so only kernel layers count.
The child is forked from a template process per set of libraries that has done the imports and
holds nothing else (sandbox_child.py), with a minimal environment, in namespaces of its own where
the kernel allows, ahead of need: a warm spare (SparePool) that waits, holding no table and no
code, for one episode. Then it receives, over
a socket, read-only descriptors of exactly the Environment's gated table files (written once per
cutoff: table_files.py) and maps them, so nothing after the cutoff is in its memory, and locks
itself down (lockdown.py) before any agent code runs. Without the seccomp allowlist code blocks are refused
unless the operator allows them (``allow_unconfined``, MIRAI_SANDBOX_ALLOW_UNCONFINED). The parent
trusts nothing the child writes: a reply is length-prefixed, capped, read under the block's
deadline and checked against its request; a timeout, crash or protocol violation kills the child
and a fresh one serves the next block. Threat model, layers and what is not defended:
docs/agent_api.md, "Threat model: agent code".
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipeline.agent_api import cutoff_gate
from pipeline.agent_api.cutoff_gate import CutoffGate, GateError
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.agent_api.sandbox_protocol import FORK, FORKED, LIBRARIES, MAX_OBSERVATION_CHARS, TRUNCATION_NOTE, WARM
from pipeline.agent_api.shared_pages import SHARED_PAGES, process_tree

DEFAULT_TIMEOUT_S = 30.0
# What a code block may allocate beyond the child's size at lockdown (address space, lockdown.set_limits).
# A MIRAI-style block (60 get_events calls into a pandas frame, a groupby, a relation distribution)
# grew a numpy+pandas child by 4 MB of address space and 8 MB resident; 256 MB is 30 times that and
# lets 32 sandboxes (and their spares) fit a 24 GB machine (docs/evaluation.md, "Memory"). Beyond it
# an allocation is a MemoryError observation and the variables survive.
DEFAULT_MEMORY_MB = 256
DEFAULT_CPU_BUDGET_S = 600
START_TIMEOUT_S = 120.0
# How long a child whose pipe broke may take to end by itself, so that its exit code is reported.
ENDED_GRACE_S = 2.0
# How long a sandbox child may take to stop after SIGSTOP (measured: well under a millisecond); one
# that is not stopped by then is killed before the cutoff gate is given back.
STOP_TIMEOUT_S = 2.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The largest reply a well-behaved child can send: a capped observation, every character escaped
# by json.dumps to at most 12 bytes (a surrogate pair, "\\udXXX\\udXXX"), plus the envelope.
MAX_OUTPUT_CHARS = MAX_OBSERVATION_CHARS + len(TRUNCATION_NOTE)
REPLY_CAP_BYTES = 12 * MAX_OUTPUT_CHARS + 1024
READY_CAP_BYTES = 64 * 1024
# The layers a report names (docs/agent_api.md, "Threat model"); evaluations record these.
LAYER_KEYS = ("namespaces", "empty_root", "landlock", "seccomp", "audit_hook", "shared_pages")
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


def _open_table_files(env) -> tuple[list[list[int]], list[int]]:
    """Read-only descriptors of ``env``'s table file parts ([events, news] per part) and all of
    them in a flat list; SandboxError (nothing left open) if the files cannot be written or opened,
    e.g. with the temp dir full."""
    passed: list[int] = []
    try:
        parts = env.table_files()
        for part in parts:
            for path in part:
                passed.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        for fd in passed:
            os.close(fd)
        raise SandboxError(f"the sandbox's table files could not be prepared: {exc}") from exc
    return [passed[i : i + 2] for i in range(0, len(passed), 2)], passed


def _checked_report(message: dict) -> dict:
    report = message.get("ready") if set(message) == {"ready"} else None
    if not isinstance(report, dict) or not all(
        isinstance(k, str) and ((isinstance(v, str) and len(v) <= 1000) or type(v) is int) for k, v in report.items()
    ):
        raise ProtocolError("the start-up reply is not a lockdown report")
    return report


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
                self._ended = "template " + _how_it_ended(code, self.stderr)
            return self._ended


def _how_it_ended(code: int, stderr) -> str:
    """A process's exit code or signal and the tail of its stderr file (which is closed), for
    error messages."""
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


class _Spare:
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
        self._waiting: dict[tuple[str, ...], list[_Spare]] = {}  # oldest first
        self._wanted: dict[tuple[str, ...], int] = {}  # spares to keep waiting per set
        self._reserved: dict[tuple[str, ...], list[int]] = {}  # evaluations' reservations per set
        self._templates: dict[tuple[str, ...], _Template] = {}
        self._starter: threading.Thread | None = None
        self._closed = False
        self._episodes_importing = 0  # episodes waiting for their own child's imports (wait_warm)

    def take(self, libraries: tuple[str, ...]) -> _Spare:
        """The oldest spare for ``libraries`` that is alive (warm, or the closest to it), started
        now if there is none."""
        with self._lock:
            self._wanted.setdefault(libraries, 1)
            waiting = self._waiting.get(libraries, [])
            spare = waiting.pop(0) if waiting else None
        if spare is not None and spare.proc.poll() is not None:
            _Child(spare).stop()
            return self.take(libraries)
        return spare or self._spawn(libraries)

    def _spawn(self, libraries: tuple[str, ...]) -> _Spare:
        """A new spare forked from ``libraries``' template (started now if it is not running; a
        template that failed to fork is stopped, so the next spare gets a fresh one)."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed (this process is exiting)")
            template = self._templates.get(libraries)
            if template is None or template.proc.poll() is not None:
                template = self._templates[libraries] = _Template(libraries)
        try:
            return _Spare(template)
        except SandboxError as exc:
            with self._lock:
                if self._templates.get(libraries) is template:
                    del self._templates[libraries]
            raise SandboxError(f"{exc}; {template.stop()}") from exc

    def wait_warm(self, spare: _Spare) -> None:
        """Until a taken spare's imports are done (_Spare.wait_warm). While an episode waits so,
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
            _Child(spare).stop()
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
                    _Child(spare).stop()
                    return
                self._waiting.setdefault(libraries, []).append(spare)
            try:
                spare.wait_warm(START_TIMEOUT_S)
            except (OSError, EOFError, TimeoutError, ProtocolError):
                pass  # a spare that died is found by take() and replaced

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
            _Child(spare).stop()
        for template in templates:
            template.stop()

    def _forget(self) -> None:
        """In a forked copy of this process: the spares and templates are the parent's, not ours."""
        self.__init__()


SPARES = SparePool()
atexit.register(SPARES.close)
os.register_at_fork(after_in_child=SPARES._forget)


def _stat_state(path: str) -> str:
    """The state letter of a /proc .../stat file (proc(5)); the name before it is the process's own
    to choose (PR_SET_NAME), parentheses included, so it is read after the last ')'."""
    with open(path, "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()[0].decode()


def _thread_states(pid: int) -> list[str]:
    """The state of every thread of ``pid`` (/proc/<pid>/task/<tid>/stat): a stop holds only once
    each of them is stopped, since a thread still running could resume the others."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            states.append(_stat_state(f"/proc/{pid}/task/{task}/stat"))
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return states


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[1])


class _SandboxProcess:
    """The sandbox child itself (the spare's waiter forks it), held by a pidfd so that stopping,
    continuing and killing it never reach a process that reused its pid. Between blocks it is
    stopped: it runs only while its parent holds the cutoff gate (cutoff_gate.py)."""

    def __init__(self, waiter_pid: int):
        children = process_tree(waiter_pid)[1:2]
        if not children:
            raise ProtocolError("the sandbox child is not the waiter's child")
        self.pid = children[0]
        self._pidfd = os.pidfd_open(self.pid)
        try:
            if _parent_of(self.pid) != waiter_pid:  # the pid was reused before the pidfd held it
                raise ProtocolError("the sandbox child is not the waiter's child")
        except (OSError, ProtocolError):
            os.close(self._pidfd)
            raise

    def _signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self._pidfd, signum)
        except ProcessLookupError:
            pass

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def pause(self) -> None:
        """Stopped (SIGSTOP) before this returns, or ended: OSError if it runs on."""
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            if select.select([self._pidfd], [], [], 0)[0]:
                return  # ended
            try:
                states = _thread_states(self.pid)
            except FileNotFoundError:
                return  # ended and reaped
            # Every thread stopped, or every one a zombie (the process is ending); a zombie beside
            # a thread that is not stopped is not enough (lockdown kills a thread ending alone).
            if states and (all(state == "T" for state in states) or all(state in "ZX" for state in states)):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise OSError(f"the sandbox child did not stop within {STOP_TIMEOUT_S:g} s and was killed")
            time.sleep(0.0002)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        os.close(self._pidfd)


class _Child:
    """One child process and its pipes: a spare, once handed an episode."""

    def __init__(self, spare: _Spare):
        self.proc, self.stderr, self.memory_mb, self.requests = spare.proc, spare.stderr, 0, 0
        self._spare = spare
        self.sandbox: _SandboxProcess | None = None

    @classmethod
    def start(cls, env, memory_mb: int, cpu_budget_s: int, allow_unconfined: bool, libraries: tuple[str, ...]):
        # The child receives read-only descriptors of exactly its environment's table files (opened
        # here, so it never needs a path) and maps them before lockdown: nothing is serialised or
        # copied per start (table_files.py). Opened before a spare is taken, so that a failure
        # leaves nothing open and nothing started.
        table_fds, passed = _open_table_files(env)
        try:
            spare = SPARES.take(libraries)
        except BaseException:
            for fd in passed:
                os.close(fd)
            raise
        self = cls(spare)
        self.memory_mb = memory_mb
        config = {
            "start": env.start.isoformat(),
            "cutoff": env.cutoff.isoformat(),
            "query_date": env.query_date.isoformat(),
            "distance_days": env.distance_days,
            "tools": env.tools,
            "count_both_actors": env.count_both_actors,
            "memory_mb": memory_mb,
            "cpu_budget_s": cpu_budget_s,
            # The child mounts its empty root only in a mount namespace other than this one.
            "parent_mount_namespace": os.readlink("/proc/self/ns/mnt"),
            "parts": len(table_fds),
        }
        # Requests go out non-blocking under a deadline: a child that stops reading its stdin
        # cannot hang the evaluation.
        os.set_blocking(self.proc.stdin.fileno(), False)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            SPARES.wait_warm(spare)
            with spare.channel:
                spare.channel.settimeout(max(0.001, deadline - time.monotonic()))
                payload = json.dumps(config).encode()
                if spare.channel.send(payload) != len(payload):
                    raise ProtocolError("the configuration did not go out whole")
                for part in table_fds:
                    socket.send_fds(spare.channel, [b"p"], part)
            self.report = _checked_report(self.receive(deadline - time.monotonic(), READY_CAP_BYTES))
            # Before any agent code: every file page the child maps stays resident, so siblings
            # share no page-cache state to signal through (shared_pages.py).
            SHARED_PAGES.keep_mapped_by(self.proc.pid)
            self.report["shared_pages"] = SHARED_PAGES.status()
            # Stopped until its first block: from now on it runs only under the cutoff gate.
            self.sandbox = _SandboxProcess(self.proc.pid)
            self.sandbox.pause()
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            detail = self.stop()
            raise SandboxError(f"the sandbox process did not start: {exc}; {detail}") from exc
        finally:
            for fd in passed:
                os.close(fd)
            SPARES.started(libraries)
        if str(self.report.get("seccomp", "unavailable")).startswith("unavailable") and not allow_unconfined:
            self.stop()
            raise SandboxError(
                f"code blocks are refused: the seccomp allowlist could not be installed "
                f"({self.report.get('seccomp')}); an operator may allow unconfined code blocks "
                "with MIRAI_SANDBOX_ALLOW_UNCONFINED=true (docs/agent_api.md)"
            )
        return self

    def _send(self, payload: bytes, deadline: float) -> None:
        """One length-prefixed message to the child's stdin, or TimeoutError at ``deadline``."""
        fd = self.proc.stdin.fileno()
        for part in (len(payload).to_bytes(4, "big"), payload):
            view = memoryview(part)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                    raise TimeoutError
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            data = os.read(fd, min(size - len(buf), 1 << 16))
            if not data:
                raise EOFError
            buf += data
        return bytes(buf)

    def receive(self, timeout_s: float, cap: int) -> dict:
        """The next message as a JSON object: TimeoutError after ``timeout_s``, EOFError if the
        child died, ProtocolError for anything larger than ``cap`` bytes or not a JSON object
        (nothing beyond the cap is read)."""
        deadline = time.monotonic() + timeout_s
        size = int.from_bytes(self._read_exactly(4, deadline), "big")
        if size > cap:
            raise ProtocolError(f"a reply of {size} bytes, over the cap of {cap}")
        try:
            message = json.loads(self._read_exactly(size, deadline))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise ProtocolError(f"a reply that is not JSON ({type(exc).__name__})") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"a reply that is a JSON {type(message).__name__}, not an object")
        return message

    def run(self, code: str, timeout_s: float) -> str:
        """Send one block and return its output, checked against the request it answers."""
        fd = self.proc.stdout.fileno()
        if select.select([fd], [], [], 0)[0]:
            if not os.read(fd, 1):
                raise EOFError
            raise ProtocolError("bytes on the pipe before any request")
        self.requests += 1
        deadline = time.monotonic() + timeout_s
        self._send(json.dumps({"id": self.requests, "code": code}).encode(), deadline)
        reply = self.receive(deadline - time.monotonic(), REPLY_CAP_BYTES)
        if set(reply) != {"id", "output"} or type(reply["id"]) is not int:
            raise ProtocolError(f"a reply with the keys {sorted(reply)[:5]!r}, not 'id' and 'output'")
        if reply["id"] != self.requests:
            raise ProtocolError(f"the reply to request {reply['id']} when {self.requests} was due")
        output = reply["output"]
        if not isinstance(output, str) or len(output) > MAX_OUTPUT_CHARS:
            raise ProtocolError(
                f"an output that is a {type(output).__name__}"
                + (f" of {len(output)} characters" if isinstance(output, str) else "")
            )
        # JSON can carry lone surrogates ('\\ud800'), which no UTF-8 request to an LLM endpoint can:
        # they are shown escaped, so the agent's output cannot end its own episode.
        return output.encode("utf-8", "backslashreplace").decode("utf-8")

    def stop(self, ended_s: float = 0.0) -> str:
        """Kill the child; return how it ended and the tail of its stderr (for error messages).
        ``ended_s``: how long to wait first for a child that closed its pipe (it is ending: its
        waiter then reports its exit code, which a kill would replace)."""
        if self.proc.poll() is None and (ended_s <= 0 or self.proc.wait(ended_s) is None):
            if self.sandbox is not None:
                self.sandbox.kill()
            self.proc.kill()
        code = self.proc.wait()
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        self._spare.close_channel()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return _how_it_ended(code, self.stderr)


def installed_libraries() -> tuple[str, ...]:
    """The sandbox_protocol.LIBRARIES this interpreter has (numpy and pandas always: they are
    dependencies; networkx and scikit-learn when installed), in LIBRARIES order."""
    return tuple(name for name in LIBRARIES if importlib.util.find_spec(name) is not None)


class Sandbox:
    """Runs code blocks for one Environment. The child starts on the first block (and again after a
    timeout, crash or broken reply), so environments that never run code cost nothing.
    ``allow_unconfined``: run code blocks even where the seccomp allowlist cannot be installed
    (an operator's explicit choice; the report says so). ``libraries``: names from
    sandbox_protocol.LIBRARIES (numpy, pandas, networkx, sklearn) the child loads before lockdown, if
    installed, so that agent code may import them; each costs start time, so none by default.
    ``gate``: the cutoff gate its blocks run under (cutoff_gate.py; the machine's by default)."""

    def __init__(
        self,
        env,
        *,
        memory_mb: int = DEFAULT_MEMORY_MB,
        cpu_budget_s: int = DEFAULT_CPU_BUDGET_S,
        allow_unconfined: bool = False,
        libraries: tuple[str, ...] = (),
        gate: CutoffGate | None = None,
    ):
        unknown = sorted(set(libraries) - set(LIBRARIES))
        if unknown:
            raise ValueError(f"unknown sandbox libraries {unknown}: the choice is {', '.join(LIBRARIES)}")
        self._libraries = tuple(libraries)
        self._env = env
        self._memory_mb = memory_mb
        self._cpu_budget_s = cpu_budget_s
        self._allow_unconfined = allow_unconfined
        self._gate = gate if gate is not None else cutoff_gate.CUTOFF_GATE
        self._child: _Child | None = None
        self.last_report: dict | None = None
        self.gate_wait_s = 0.0  # waited for the cutoff gate, all blocks together

    def _ensure(self, memory_mb: int) -> _Child:
        if self._child is not None and self._child.memory_mb != memory_mb:
            self._restart()
        if self._child is None:
            if machine() not in SECCOMP_ARCHES and not self._allow_unconfined:
                raise SandboxError(
                    f"code blocks are refused on {sys.platform}/{machine()}: the seccomp allowlist is "
                    f"written for {', '.join(SECCOMP_ARCHES)}; an operator may allow unconfined code "
                    "blocks with MIRAI_SANDBOX_ALLOW_UNCONFINED=true (docs/agent_api.md)"
                )
            self._child = _Child.start(
                self._env, memory_mb, self._cpu_budget_s, self._allow_unconfined, self._libraries
            )
            self.last_report = self._child.report
        return self._child

    def _restart(self, ended_s: float = 0.0) -> str:
        detail = self._child.stop(ended_s) if self._child is not None else ""
        self._child = None
        return detail

    def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        """The observation for ``code``. ``memory_mb`` is the child's memory budget: a different
        value than the running child's restarts it (losing variables). Whatever the child does,
        this returns an observation; only a child that cannot start raises SandboxError."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        self._memory_mb = self._memory_mb if memory_mb is None else memory_mb
        child = self._ensure(self._memory_mb)
        # The child runs only under the gate, and is stopped or dead before the gate is given back.
        try:
            with self._gate.hold(self._env.cutoff) as waited:
                self.gate_wait_s += waited
                return self._run_resumed(child, code, timeout)
        except GateError as exc:  # only taking the gate raises it
            raise SandboxError(f"code blocks are refused: {exc}") from exc

    def _run_resumed(self, child: _Child, code: str, timeout: float) -> str:
        try:
            child.sandbox.resume()
            output = child.run(code, timeout)
            child.sandbox.pause()
            return output
        except TimeoutError:
            self._restart()
            return (
                f"TimeoutError: the code block ran longer than {timeout:g} s and was stopped; "
                "the sandbox was restarted, so variables defined earlier are gone"
            )
        except ProtocolError as exc:
            self._restart()
            return (
                f"SandboxError: the sandbox process broke the reply protocol ({exc}) and was stopped; "
                "the sandbox was restarted, so variables defined earlier are gone"
            )
        except (OSError, EOFError):
            detail = self._restart(ended_s=ENDED_GRACE_S)
            return (
                f"SandboxError: the code block ended the sandbox process ({detail.split(';')[0]}), "
                "e.g. by exceeding its memory or CPU limit; the sandbox was restarted, so variables "
                "defined earlier are gone"
            )
        except BaseException:  # never leave a child running once the gate is given back
            self._restart()
            raise

    def close(self) -> None:
        self._restart()


def layers(report: dict | None) -> dict | None:
    """The confinement layers a lockdown report names (no per-child numbers): what an evaluation
    records."""
    return None if report is None else {key: report.get(key, "absent") for key in LAYER_KEYS}
