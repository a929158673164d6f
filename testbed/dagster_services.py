"""The real Dagster daemon and webserver, for the tests and benches that need schedules, sensors,
the run queue or the UI's API: started from workspace.yaml in a session of their own, stopped with
their code servers and run workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import requests

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@contextmanager
def _own_session(args: list[str], env: dict, output: IO | int, errors: IO | int) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=output, stderr=errors, start_new_session=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def running_daemon(env: dict, log: Path | None = None) -> Iterator[subprocess.Popen]:
    """``dagster-daemon run``; its output appended to ``log`` if given. Create the instance's
    storage before calling this: the daemon creating it at the same time as the caller can leave
    SQLite's schedule storage with two alembic heads, and then no sensor runs."""
    args = [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"]
    if log is None:
        with _own_session(args, env, subprocess.DEVNULL, subprocess.DEVNULL) as daemon:
            yield daemon
    else:
        with open(log, "ab") as out, _own_session(args, env, out, subprocess.STDOUT) as daemon:
            yield daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    """The webserver's GraphQL API, as the UI calls it; an error answer raises AssertionError."""
    response = requests.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


@contextmanager
def running_webserver(env: dict, timeout_s: float = 180) -> Iterator[str]:
    """dagster-webserver on 127.0.0.1; yields its URL once the code location answers."""
    port = free_port()
    args = [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    url = f"http://127.0.0.1:{port}"
    query = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }"
    with _own_session(args, env, subprocess.DEVNULL, subprocess.PIPE) as webserver:
        deadline = time.monotonic() + timeout_s
        while True:
            assert webserver.poll() is None, webserver.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the webserver did not come up"
            try:
                if graphql(url, query)["repositoriesOrError"].get("nodes"):
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        yield url
