"""Running agents' code blocks: one long-lived, locked-down child process per environment.

The agent's code is assumed to own the child's Python interpreter, so only kernel layers count.
The child is forked from a template process per set of libraries that has done the imports and
holds nothing else (sandbox_child.py), with a minimal environment, in namespaces of its own where
the kernel allows, ahead of need: a warm spare (sandbox_spares.py) that waits, holding no table and
no code, for one episode. Then it receives, over
a socket, read-only descriptors of exactly the Environment's gated table files (written once per
cutoff: table_files.py) and maps them, so nothing after the cutoff is in its memory, and locks
itself down (lockdown.py) before any agent code runs. Without the seccomp allowlist code blocks are refused
unless the operator allows them (``allow_unconfined``, MIRAI_SANDBOX_ALLOW_UNCONFINED). The parent
trusts nothing the child writes: a reply is length-prefixed, capped, read under the block's
deadline and checked against its request; a timeout, crash or protocol violation kills the child
and a fresh one serves the next block. It exists only while its episode holds the cutoff gate
(cutoff_gate.py), from the first block until close, and is stopped between blocks. Threat model, layers and what is not defended:
docs/agent_api.md, "Threat model: agent code".
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from pipeline.agent_api import cutoff_gate
from pipeline.agent_api.cutoff_gate import CutoffGate, GateError, HeldByThisThread, Lease
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.agent_api.sandbox_protocol import LIBRARIES, MAX_OBSERVATION_CHARS, TRUNCATION_NOTE
from pipeline.agent_api.sandbox_spares import SPARES, START_TIMEOUT_S, ProtocolError, SandboxError, Spare
from pipeline.agent_api.shared_pages import SHARED_PAGES, process_tree

DEFAULT_TIMEOUT_S = 30.0
# What a code block may allocate beyond the child's size at lockdown (address space, lockdown.set_limits).
# A MIRAI-style block (60 get_events calls into a pandas frame, a groupby, a relation distribution)
# grew a numpy+pandas child by 4 MB of address space and 8 MB resident; 256 MB is 30 times that and
# lets 32 sandboxes (and their spares) fit a 24 GB machine (docs/evaluation.md, "Memory"). Beyond it
# an allocation is a MemoryError observation and the variables survive.
DEFAULT_MEMORY_MB = 256
DEFAULT_CPU_BUDGET_S = 600
# How long a child whose pipe broke may take to end by itself, so that its exit code is reported.
ENDED_GRACE_S = 2.0
# How long a sandbox child may take to stop after SIGSTOP (measured: well under a millisecond); one
# that is not stopped by then is killed before its block returns.
STOP_TIMEOUT_S = 2.0
# How long an episode's close waits for a killed child that had not ended within STOP_TIMEOUT_S
# before a thread of its own waits for it (the lease is given back only once it has ended).
LINGER_TIMEOUT_S = 60.0
# The largest reply a well-behaved child can send: a capped observation, every character escaped
# by json.dumps to at most 12 bytes (a surrogate pair, "\\udXXX\\udXXX"), plus the envelope.
MAX_OUTPUT_CHARS = MAX_OBSERVATION_CHARS + len(TRUNCATION_NOTE)
REPLY_CAP_BYTES = 12 * MAX_OUTPUT_CHARS + 1024
READY_CAP_BYTES = 64 * 1024
# The layers a report names (docs/agent_api.md, "Threat model"); evaluations record these.
LAYER_KEYS = ("namespaces", "empty_root", "landlock", "seccomp", "audit_hook", "shared_pages")


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
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile (ESRCH while it is being torn down)
    return states


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[1])


class _SandboxProcess:
    """The sandbox child itself (the spare's waiter forks it), held by a pidfd so that stopping,
    continuing and killing it never reach a process that reused its pid. Between blocks it is
    stopped: it runs only during its blocks."""

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
            except (FileNotFoundError, ProcessLookupError):
                return  # ended and reaped, or being torn down
            # Every thread stopped or a zombie: a main thread that ended alone stays a zombie while
            # the others may run on, so the process's own state says nothing.
            if all(state in {"T", "Z", "X"} for state in states):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise OSError(f"the sandbox child did not stop within {STOP_TIMEOUT_S:g} s and was killed")
            time.sleep(0.0002)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait_ended(self, timeout_s: float | None) -> bool:
        """Whether every thread has exited and its memory is freed (the pidfd turns readable then)
        within ``timeout_s`` (None: however long it takes): the kernel's teardown of a large child
        takes tens of milliseconds, and a sibling of another cutoff must not start meanwhile, since
        the child chose when it would happen and how much there is to free (a re-attack timed it)."""
        return bool(select.select([self._pidfd], [], [], timeout_s)[0])

    def close(self) -> None:
        os.close(self._pidfd)


class _Child:
    """One child process and its pipes: a spare, once handed an episode."""

    def __init__(self, spare: Spare):
        self.proc, self.stderr, self.memory_mb, self.requests = spare.proc, spare.stderr, 0, 0
        self._spare = spare
        self.sandbox: _SandboxProcess | None = None
        # The child itself once killed, if it had not ended within STOP_TIMEOUT_S: the episode's
        # close waits for it before it gives the gate back (Sandbox.close).
        self.lingering: _SandboxProcess | None = None

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
            "dialect": env.dialect,
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
            # Stopped until its block: from now on it runs only during blocks.
            self.sandbox = _SandboxProcess(self.proc.pid)
            self.sandbox.pause()
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            detail = self._stop_unstarted()
            raise SandboxError(f"the sandbox process did not start: {exc}; {detail}") from exc
        finally:
            for fd in passed:
                os.close(fd)
            SPARES.started(libraries)
        if str(self.report.get("seccomp", "unavailable")).startswith("unavailable") and not allow_unconfined:
            self._stop_unstarted()
            raise SandboxError(
                f"code blocks are refused: the seccomp allowlist could not be installed "
                f"({self.report.get('seccomp')}); an operator may allow unconfined code blocks "
                "with MIRAI_SANDBOX_ALLOW_UNCONFINED=true (docs/agent_api.md)"
            )
        return self

    def _stop_unstarted(self) -> str:
        """stop() for a child that ran no agent code: one still ending is not waited for."""
        detail = self.stop()
        if self.lingering is not None:
            self.lingering.close()
            self.lingering = None
        return detail

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
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            if self.proc.poll() is None and (ended_s <= 0 or self.proc.wait(ended_s) is None):
                sandbox.kill()
                ended_s = 0.0  # its waiter is killed at once too
            if sandbox.wait_ended(STOP_TIMEOUT_S):
                sandbox.close()
            else:
                self.lingering = sandbox
        return self._spare.stop(ended_s)


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
    ``gate``: the cutoff gate the episode holds from its first block until close (cutoff_gate.py;
    the machine's by default); ``handover_grid_s``: its lease's wait at a backward handover
    (MIRAI_SANDBOX_HANDOVER_GRID_S; None: the gate's)."""

    def __init__(
        self,
        env,
        *,
        memory_mb: int = DEFAULT_MEMORY_MB,
        cpu_budget_s: int = DEFAULT_CPU_BUDGET_S,
        allow_unconfined: bool = False,
        libraries: tuple[str, ...] = (),
        gate: CutoffGate | None = None,
        handover_grid_s: float | None = None,
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
        self._handover_grid_s = handover_grid_s
        self._child: _Child | None = None
        self._lease: Lease | None = None
        self._lingering: list[_SandboxProcess] = []  # killed children not yet ended (_Child.stop)
        self.last_report: dict | None = None

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
        detail = ""
        if self._child is not None:
            try:
                detail = self._child.stop(ended_s)
            finally:
                if self._child.lingering is not None:
                    self._lingering.append(self._child.lingering)
                    self._child.lingering = None
        self._child = None
        return detail

    def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        """The observation for ``code``. ``memory_mb`` is the child's memory budget: a different
        value than the running child's restarts it (losing variables). Whatever the child does,
        this returns an observation; only a child that cannot start, or a gate that refuses the
        episode its lease, raises SandboxError."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        self._memory_mb = self._memory_mb if memory_mb is None else memory_mb
        if self._lease is None:
            self._lease = self._leased()
        try:
            child = self._ensure(self._memory_mb)
        except BaseException:
            if self._child is None:  # no child running: give the lease back once none exists
                self._lease, lease = None, self._lease
                lingering, self._lingering = self._lingering, []
                _release_once_ended(lease, lingering)
            raise
        return self._run_resumed(child, code, timeout)

    def _leased(self) -> Lease:
        """The episode's lease of the gate, taken at its first block and held until close: no child
        of this sandbox exists without it (cutoff_gate.py)."""
        try:
            try:
                return self._gate.lease(self._env.cutoff, self._handover_grid_s)
            except HeldByThisThread:
                # An environment this thread no longer references but a reference cycle keeps
                # alive closes its sandbox, and gives its lease back, when it is collected.
                gc.collect()
                return self._gate.lease(self._env.cutoff, self._handover_grid_s)
        except GateError as exc:
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
        except BaseException:  # never leave a child running that the evaluation no longer drives
            self._restart()
            raise

    def close(self) -> None:
        """Kill the child and wait until it is gone, then give the episode's lease back (from any
        thread: close runs from Environment.__del__ too). A killed child the kernel had not ended
        within STOP_TIMEOUT_S (a crash dumped to a pipe, for which the kernel ignores RLIMIT_CORE
        and, with kernel.core_pipe_limit set, waits for the helper; a loaded machine) is waited for up to LINGER_TIMEOUT_S here, then by a thread of its own: the lease
        is given back only once every child of the episode has ended."""
        try:
            self._restart()
        finally:
            lease, self._lease = self._lease, None
            lingering, self._lingering = self._lingering, []
            _release_once_ended(lease, lingering)


def _release_once_ended(lease: Lease | None, lingering: list[_SandboxProcess]) -> None:
    """Give ``lease`` back once every child in ``lingering`` has ended (Sandbox.close)."""
    deadline = time.monotonic() + LINGER_TIMEOUT_S
    pending = []
    for child in lingering:
        if child.wait_ended(max(0.0, deadline - time.monotonic())):
            child.close()
        else:
            pending.append(child)
    if not pending:
        if lease is not None:
            lease.release()
        return

    def when_ended() -> None:
        for child in pending:
            child.wait_ended(None)
            child.close()
        if lease is not None:
            lease.release()

    threading.Thread(target=when_ended, name="sandbox-lingering", daemon=True).start()


def layers(report: dict | None) -> dict | None:
    """The confinement layers a lockdown report names (no per-child numbers): what an evaluation
    records."""
    return None if report is None else {key: report.get(key, "absent") for key in LAYER_KEYS}
