"""The real Dagster daemon for tests that need schedules, sensors and the run queue, and the real
webserver for those that act as the UI does: started from workspace.yaml in a session of their
own, stopped with their code servers and run workers."""

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

import requests

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    """The webserver's GraphQL API, as the UI calls it; an error answer fails the test."""
    response = requests.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


@contextmanager
def running_webserver(env: dict, timeout_s: float = 180) -> Iterator[str]:
    """dagster-webserver on 127.0.0.1 for workspace.yaml; yields its URL once the code location
    answers."""
    port = free_port()
    webserver = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    query = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }"
    try:
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
    finally:
        os.killpg(webserver.pid, signal.SIGTERM)
        try:
            webserver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(webserver.pid, signal.SIGKILL)
            webserver.wait()
