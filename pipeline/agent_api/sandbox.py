"""Running agents' code blocks: one long-lived, locked-down child process per environment.

Threat model. The agent is an LLM whose code may, by accident or by design, try to see the future:
read the database files, the parent's tables or a date knob, reach the network, or start
programs. MIRAI v1 ran code blocks with ``exec`` inside the process that held the whole database
(reference code §4), so it could. Here:

- The child process (``sandbox_child.py``) is a fresh interpreter, not a fork: it shares no memory
  with the parent. It is started with a minimal environment (no inherited variables, so no
  credentials), in ``/``, and never learns the data directory.
- It receives exactly the Environment's gated tables over a pipe, so rows after the cutoff are not
  in its memory at all, and there is no end-date setting to change: the cutoff is baked into the
  data it holds.
- Before any agent code runs it locks itself down (lockdown.py): rlimits on memory, CPU seconds,
  file size and file descriptors; a seccomp filter denying file, network, exec/fork, signalling
  and tracing syscalls (Linux x86_64); an audit hook denying the corresponding Python events and
  imports outside an allow-list; builtins without ``open``/``input``.
- The parent enforces a wall-clock timeout per block. On timeout, crash (memory or CPU limit) or
  a garbled reply it kills the child and starts a fresh one on the next call; the observation says
  that variables were reset. The environment itself is unaffected.

What it does not defend against: the agent reading anything inside the child (the gated tables,
the reference tables, its own variables); denial of service within the limits; kernel exploits;
an unfiltered platform (without seccomp, a native-code escape from Python could reach the files).
Variables persist between blocks of one child, as in MIRAI; a restart loses them.
"""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from pipeline.agent_api.sandbox_child import write_message

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_CPU_BUDGET_S = 600
START_TIMEOUT_S = 120.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SandboxError(RuntimeError):
    """The child could not be started or stopped answering sensibly."""


def _ipc(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_ipc(buf, compression="uncompressed")
    return buf.getvalue()


class _Child:
    """One child process and its pipes."""

    def __init__(self, env, memory_mb: int, cpu_budget_s: int):
        self.memory_mb = memory_mb
        # Kept for the child's lifetime (closed in stop), so not a with-block.
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.agent_api.sandbox_child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            cwd="/", close_fds=True,
            env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                 "PYTHONDONTWRITEBYTECODE": "1"},
        )
        events, news = env.tables()
        config = {"start": env.start.isoformat(), "cutoff": env.cutoff.isoformat(),
                  "query_date": env.query_date.isoformat(), "distance_days": env.distance_days,
                  "memory_mb": memory_mb, "cpu_budget_s": cpu_budget_s}
        try:
            write_message(self.proc.stdin, json.dumps(config).encode())
            write_message(self.proc.stdin, _ipc(events))
            write_message(self.proc.stdin, _ipc(news))
            self.report = self.receive(START_TIMEOUT_S)["ready"]
        except (OSError, EOFError, TimeoutError, KeyError, ValueError) as exc:
            detail = self.stop()
            raise SandboxError(f"the sandbox process did not start: {exc}; {detail}") from exc

    def receive(self, timeout_s: float) -> dict:
        """The next reply, or TimeoutError after ``timeout_s``; EOFError if the child died."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        chunks, need, header = [], 4, None
        while need:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            data = os.read(fd, need)
            if not data:
                raise EOFError
            chunks.append(data)
            need -= len(data)
            if not need and header is None:
                header = b"".join(chunks)
                chunks, need = [], int.from_bytes(header, "big")
        return json.loads(b"".join(chunks))

    def stop(self) -> str:
        """Kill the child; return how it ended and the tail of its stderr (for error messages)."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
        self.stderr.close()
        ended = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return ended + (f"; stderr: {tail}" if tail else "")


class Sandbox:
    """Runs code blocks for one Environment. The child starts on the first block (and again after a
    timeout or crash), so environments that never run code cost nothing."""

    def __init__(self, env, *, memory_mb: int = DEFAULT_MEMORY_MB, cpu_budget_s: int = DEFAULT_CPU_BUDGET_S):
        self._env = env
        self._memory_mb = memory_mb
        self._cpu_budget_s = cpu_budget_s
        self._child: _Child | None = None

    @property
    def report(self) -> dict:
        """What the running child's lockdown applied (starts the child if needed)."""
        return self._ensure(self._memory_mb).report

    def _ensure(self, memory_mb: int) -> _Child:
        if self._child is not None and self._child.memory_mb != memory_mb:
            self._restart()
        if self._child is None:
            self._child = _Child(self._env, memory_mb, self._cpu_budget_s)
        return self._child

    def _restart(self) -> str:
        detail = self._child.stop() if self._child is not None else ""
        self._child = None
        return detail

    def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        """The observation for ``code``. ``memory_mb`` is the child's memory budget: a different
        value than the running child's restarts it (losing variables)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        self._memory_mb = self._memory_mb if memory_mb is None else memory_mb
        child = self._ensure(self._memory_mb)
        try:
            write_message(child.proc.stdin, json.dumps({"code": code}).encode())
            return child.receive(timeout)["output"]
        except TimeoutError:
            self._restart()
            return (f"TimeoutError: the code block ran longer than {timeout:g} s and was stopped; "
                    "the sandbox was restarted, so variables defined earlier are gone")
        except (OSError, EOFError, KeyError, ValueError):
            detail = self._restart()
            return (f"SandboxError: the code block ended the sandbox process ({detail.split(';')[0]}), "
                    "e.g. by exceeding its memory or CPU limit; the sandbox was restarted, so variables "
                    "defined earlier are gone")

    def close(self) -> None:
        self._restart()


