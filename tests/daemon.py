"""The real Dagster daemon for tests that need schedules, sensors and the run queue: started from
workspace.yaml in a session of its own, stopped with its code servers and run workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .conftest import ROOT

BIN = Path(sys.executable).parent


@contextmanager
def running_daemon(env: dict) -> Iterator[subprocess.Popen]:
    """Create the instance's storage before calling this: the daemon creating it at the same time
    as the test can leave SQLite's schedule storage with two alembic heads, and then no sensor runs."""
    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield daemon
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
