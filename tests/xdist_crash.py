"""Stop the whole pytest-xdist session when a worker process dies (segfault, abort, SIGKILL).

`make test` runs `-p tests.xdist_crash --max-worker-restart=0`. Without the option xdist replaces a
crashed worker and, under `--dist loadfile`, then hangs for ever (pytest-xdist #784, #1323) or runs
the crashed test's file again on each new worker. With it the controller only sends "shutdown" to the
other workers, which first run every test already queued to them: under loadfile the rest of their
files, many minutes for our long ones. So the controller writes a flag file when a worker dies, and
each worker checks it after every test and sets `session.shouldstop`, which ends xdist's worker loop
and, through the controller, the session.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

FLAG_KEY = "xdist_crash_flag"
_flag_dir = pytest.StashKey[Path]()


def _flag(config: pytest.Config) -> Path | None:
    """The flag file's path: on a worker, the one its controller gave; on the controller, its own."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return Path(workerinput[FLAG_KEY]) if FLAG_KEY in workerinput else None
    directory = config.stash.get(_flag_dir, None)
    return directory / "worker-crashed" if directory else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    config = node.config
    if _flag_dir not in config.stash:
        config.stash[_flag_dir] = Path(tempfile.mkdtemp(prefix="xdist-crash-"))
    node.workerinput[FLAG_KEY] = str(_flag(config))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    flag = _flag(node.config)
    if error is not None and flag is not None:  # None: the worker finished normally
        partial = flag.with_suffix(".partial")  # renamed into place, so a worker never reads it half written
        partial.write_text(f"worker {node.gateway.id} crashed ({error})")
        partial.replace(flag)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    flag = _flag(item.config)  # None unless on an xdist worker
    if flag is not None and flag.exists() and not item.session.shouldstop:
        item.session.shouldstop = f"{flag.read_text()}: stopping the suite"
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_flag_dir, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
