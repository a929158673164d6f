"""What bounds an evaluation's concurrent episodes, and what survives a killed run
(docs/evaluation.md, "Concurrency, rate limits and resume"):

- ``RateLimiter``: an endpoint's requests and tokens per minute over a sliding 60-second window,
  shared by every episode of a run, and a shared pause after a 429 (the server's Retry-After, or an
  exponential back-off that grows with consecutive 429s), so a throttled endpoint is not hammered
  by every thread at once;
- ``sandbox_cap`` and ``SandboxSlots``: how many code sandboxes fit in the machine's available
  memory, and a semaphore that keeps the live ones to that many;
- ``EpisodeLog``: an append-only, fsynced JSONL checkpoint of finished episodes, read back on
  restart so that a killed run does not redo them;
- ``Progress``: episodes done and tokens so far, reported at a bounded rate.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

WINDOW_S = 60.0  # requests_per_minute and tokens_per_minute count over this sliding window
# A prompt's tokens before the server has counted them: ~4 characters per token, OpenAI's rule of
# thumb for English (https://platform.openai.com/tokenizer); the true count replaces it after the reply.
CHARS_PER_TOKEN = 4
# Back-off after a 429 without Retry-After: base * 2**(consecutive 429s - 1), at most max.
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
# Memory left to everything else (the parent's tables, the page cache) when sizing the sandbox cap.
MEMORY_HEADROOM = 0.8
# What a sandbox child holds besides what its code allocates, measured with smaps_rollup
# (proc(5)) on a 2-month database with numpy and pandas loaded, the largest library set a
# MIRAI-style agent gets (docs/evaluation.md, "Memory"): the interpreter's and libraries' code and
# read-only data are file pages every sandbox and spare shares (78-101 MB), counted once; a started
# sandbox's private pages were 49 MB without libraries and 84 MB with numpy and pandas after a
# MIRAI-style code block, a waiting spare's 38 and 75 MB. Plus, per sandbox, its private pages over
# the gated tables; the tables themselves are read-only files every child of a cutoff memory-maps
# (pipeline/agent_api/table_files.py), in the page cache once, so they count once (over 14 months,
# 1.1 GB of tables, a child's private pages were 56 MB: bench/sandbox_start.py --history).
SANDBOX_SHARED_MB = 100
SANDBOX_PRIVATE_MB = 100
SPARE_PRIVATE_MB = 100
PRIVATE_PER_TABLE_MB = 0.05


@dataclass(frozen=True)
class RateLimits:
    """An endpoint's limits; None: unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


UNLIMITED = RateLimits()


def estimate_tokens(messages: list[dict], max_tokens: int) -> int:
    """What a request may count against tokens_per_minute before its usage is known: the prompt's
    estimated tokens plus the completion's cap (providers reserve max_tokens the same way)."""
    return sum(len(m.get("content") or "") for m in messages) // CHARS_PER_TOKEN + max_tokens


class RateLimiter:
    """Requests and tokens per minute over a sliding window, plus a pause shared by every caller
    after a 429. ``wait_s`` is the pure computation (tested without sleeping); ``acquire`` sleeps
    it. Thread-safe."""

    def __init__(
        self,
        limits: RateLimits = UNLIMITED,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.limits = limits
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._sent: deque[list] = deque()  # [time, tokens] per request in the window, oldest first
        self._paused_until = 0.0
        self._throttled = 0  # consecutive 429s
        self.waited_s = 0.0  # total time callers slept here (reported with the run)
        self.throttles = 0  # 429s seen

    def _expire(self, now: float) -> None:
        while self._sent and self._sent[0][0] <= now - WINDOW_S:
            self._sent.popleft()

    def wait_s(self, tokens: int, now: float | None = None) -> float:
        """Seconds until a request of ``tokens`` fits both limits and the pause; 0: now."""
        with self._lock:
            return self._wait(tokens, self._clock() if now is None else now)

    def _wait(self, tokens: int, now: float) -> float:
        self._expire(now)
        waits = [self._paused_until - now]
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        if rpm is not None and len(self._sent) >= rpm:
            # The request that must leave the window before one more fits.
            waits.append(self._sent[len(self._sent) - rpm][0] + WINDOW_S - now)
        if tpm is not None and self._sent:
            excess = sum(t for _, t in self._sent) + min(tokens, tpm) - tpm
            for sent_at, sent_tokens in self._sent:
                if excess <= 0:
                    break
                excess -= sent_tokens
                waits.append(sent_at + WINDOW_S - now)
        return max(0.0, *waits)

    def acquire(self, tokens: int) -> list:
        """Wait until the request fits, then count it; returns its entry for ``settle``."""
        while True:
            with self._lock:
                now = self._clock()
                wait = self._wait(tokens, now)
                if wait <= 0:
                    entry = [now, tokens]
                    self._sent.append(entry)
                    return entry
            self.waited_s += wait
            self._sleep(wait)

    def settle(self, entry: list, tokens: int) -> None:
        """Replace a request's estimated tokens by the ones the server counted."""
        with self._lock:
            entry[1] = tokens

    def throttled(self, retry_after_s: float | None) -> float:
        """A 429: every caller pauses for the server's Retry-After, or for an exponential back-off
        that doubles with each consecutive 429; either at most BACKOFF_MAX_S (a hostile or broken
        Retry-After never stalls the run). Returns the pause."""
        with self._lock:
            self._throttled += 1
            self.throttles += 1
            pause = min(
                BACKOFF_MAX_S,
                retry_after_s if retry_after_s is not None else BACKOFF_BASE_S * 2 ** (self._throttled - 1),
            )
            self._paused_until = max(self._paused_until, self._clock() + pause)
            return pause

    def succeeded(self) -> None:
        """A request went through: the next 429 starts the back-off afresh."""
        with self._lock:
            self._throttled = 0


def available_memory_bytes() -> int:
    """Memory the machine can give new processes without swapping: Linux's MemAvailable
    (proc(5)), else the free physical pages (POSIX sysconf)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def sandbox_start_mb(tables_mb: float) -> float:
    """A started sandbox's own (private) memory when it maps ``tables_mb`` of gated tables."""
    return SANDBOX_PRIVATE_MB + PRIVATE_PER_TABLE_MB * tables_mb


def sandbox_cap(
    memory_limit_mb: int, start_mb: float, available_bytes: int | None = None, shared_mb: float = 0.0
) -> int:
    """How many sandboxes may be live at once: MEMORY_HEADROOM of the available memory, less the
    ``shared_mb`` every sandbox maps (the gated tables' files and the libraries' code, in the page
    cache once), divided by what one may hold (``start_mb``, see sandbox_start_mb, plus the
    ``memory_limit_mb`` its code may allocate on top); at least 1, so that a small machine runs
    them one at a time rather than not at all."""
    available = available_memory_bytes() if available_bytes is None else available_bytes
    per_sandbox = (start_mb + memory_limit_mb) * 2**20
    return max(1, math.floor((available * MEMORY_HEADROOM - shared_mb * 2**20) / per_sandbox))


class SandboxSlots:
    """At most ``n`` live sandboxes across a run's episodes: an episode takes a slot before its
    first code runs (which starts its sandbox) and gives it back once its environment is closed
    (which stops it). ``max_live`` is the most held at once."""

    def __init__(self, n: int):
        self.n = n
        self._free = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self.live = self.max_live = 0

    def acquire(self) -> None:
        self._free.acquire()
        with self._lock:
            self.live += 1
            self.max_live = max(self.max_live, self.live)

    def release(self) -> None:
        with self._lock:
            self.live -= 1
        self._free.release()


class EpisodeLog:
    """Finished episodes of one run, one JSON line each ({"run", "round", "query_id",
    "trajectory"}), appended and fsynced as each finishes. ``run`` keys what the episode's result
    depends on (agent config, harness, queries); lines of another key are ignored. A line cut
    short by a kill is dropped on open (the file is truncated to the last whole line). ``done``
    holds the episodes a resumed run reuses: an episode's last line, unless ``run_again`` says
    that episode is to be run again (a failed one, trajectory.run_again)."""

    def __init__(self, path: Path, run: str, run_again: Callable[[dict], bool] = lambda trajectory: False):
        self.path, self.run, self._run_again = path, run, run_again
        self._lock = threading.Lock()
        self.done: dict[tuple[int, str], dict] = {}
        good = 0
        if path.exists():
            data = path.read_bytes()
            for line in data.splitlines(keepends=True):
                try:
                    entry = json.loads(line)
                except ValueError:
                    break
                if not line.endswith(b"\n"):
                    break
                good += len(line)
                if entry.get("run") == run:
                    self.done[(entry["round"], entry["query_id"])] = entry["trajectory"]
            if good < len(data):
                with open(path, "r+b") as fh:
                    fh.truncate(good)
        self._seen = set(self.done)
        self.done = {key: trajectory for key, trajectory in self.done.items() if not self._run_again(trajectory)}

    def adopt(self, earlier: dict[tuple[int, str], dict]) -> None:
        """Reuse ``earlier`` episodes of this run (a stored run's, run.py) where the log holds none,
        by the same rule as its own lines; the log's own lines are newer."""
        for key, trajectory in earlier.items():
            if key not in self._seen and not self._run_again(trajectory):
                self.done[key] = trajectory

    def append(self, round_no: int, query_id: str, trajectory: dict) -> None:
        line = json.dumps({"run": self.run, "round": round_no, "query_id": query_id, "trajectory": trajectory})
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write(line)
            self.done[(round_no, query_id)] = trajectory

    def _write(self, line: str) -> None:
        with open(self.path, "ab") as fh:
            fh.write(line.encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def remove(self) -> None:
        """The run is stored: its checkpoint is no longer needed."""
        self.path.unlink(missing_ok=True)


@dataclass
class Progress:
    """Episodes done of total and tokens so far; ``report`` is called with a line at most once
    every ``interval_s`` (and for the last episode), so a long run's log stays short; ``watch``
    (an EpisodeBar's update) after every episode."""

    total: int
    report: Callable[[str], None] | None = None
    interval_s: float = 30.0
    done: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    clock: Callable[[], float] = time.monotonic
    watch: Callable[[Progress], None] | None = None

    def __post_init__(self):
        self._lock = threading.Lock()
        self._last = -math.inf

    def add(self, tokens_in: int, tokens_out: int) -> None:
        with self._lock:
            self.done += 1
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            if self.watch is not None:
                self.watch(self)
            now = self.clock()
            if self.report is None or (now - self._last < self.interval_s and self.done < self.total):
                return
            self._last = now
            line = self.line()
        self.report(line)

    def line(self) -> str:
        return f"{self.done}/{self.total} episodes, tokens in/out {self.tokens_in}/{self.tokens_out}"


class EpisodeBar(Protocol):
    """A progress display of a run's episodes (`mirai evaluate`'s bar on a terminal): ``start``
    with the episodes already done (resumed) and the total, ``update`` after each episode (under
    Progress's lock, so calls never overlap), ``close`` once the episodes end."""

    def start(self, done: int, total: int) -> None: ...

    def update(self, progress: Progress) -> None: ...

    def close(self) -> None: ...
