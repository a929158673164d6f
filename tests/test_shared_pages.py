"""Keeping the file pages sandboxes share resident (pipeline/agent_api/shared_pages.py): locked
where the kernel allows it, read in and said so where it does not. The attacks on the channel
itself are in test_sandbox_channels.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pipeline.agent_api.shared_pages import SharedPages

from .conftest import ROOT

KEEP_AND_REPORT = """
import sys
from pathlib import Path
from pipeline.agent_api.shared_pages import SharedPages
pages = SharedPages()
key = pages.keep_file(Path(sys.argv[1]))
print(pages.status())
print(next(line for line in Path('/proc/self/status').read_text().splitlines() if line.startswith('VmLck')))
"""


def _big_file(tmp_path, mib: int = 16):
    path = tmp_path / "part.arrow"
    path.write_bytes(os.urandom(mib << 20))
    return path


def test_a_kept_file_is_locked_and_released(tmp_path):
    path = _big_file(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", KEEP_AND_REPORT, str(path)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    if not out[0].startswith("read in and locked"):
        pytest.skip(f"this process may not lock 16 MiB here: {out[0]}")
    assert int(out[1].split()[1]) >= 16 << 10  # kB locked
    pages = SharedPages()
    key = pages.keep_file(path)
    assert pages.keep_file(path) == key and list(pages._kept) == [key]  # kept once
    pages.release(key)
    assert pages._kept == {}


@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs setpriv and root to drop CAP_IPC_LOCK"
)
def test_without_the_right_to_lock_pages_are_read_in_and_the_status_says_so(tmp_path):
    path = _big_file(tmp_path)
    # No CAP_IPC_LOCK and a 64 KiB memory-lock limit, as a container's user has (8 MiB there).
    out = subprocess.run(
        ["setpriv", "--bounding-set=-ipc_lock", "prlimit", "--memlock=65536", "--",
         sys.executable, "-c", KEEP_AND_REPORT, str(path)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0].startswith(
        ("read in, not locked (mlock refused: ENOMEM", "read in, not locked (mlock refused: EPERM")
    ), out
    assert out[1].split()[1] == "0"
