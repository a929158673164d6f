"""A test that kills its xdist worker (segfault, abort, SIGKILL) ends `make test`'s session within a
minute, failing and naming that test, instead of hanging, running the other worker's file to its end,
or running the crashing test again on replacement workers.

Each case runs a small pytest session in a subprocess with exactly the options `make test` uses
(`make pytest-options`, so the Makefile's `--max-worker-restart=0` and tests/xdist_crash.py)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION_LIMIT_S = 60  # the requirement: a dead worker ends the suite within this
SLOW_TESTS = 120  # × 1 s in one file: two minutes if the other worker ran its file to the end
# Longer than the slow file runs, so a session that stops the other worker too late fails on the
# slow-file assertion, and one that hangs fails here, instead of the test hanging.
TIMEOUT_S = 180

CRASHES = {
    "segfault": "ctypes.string_at(0)",
    "abort": "os.abort()",
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)",
}

CRASH_FILE = """\
import ctypes, os, resource, signal, time

def test_crash():
    time.sleep(2)  # the other worker is in (or done with) its file by then
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    with open("crashed-at", "w") as f:  # when the worker dies: the limit counts from here
        f.write(repr(time.time()))
    {crash}
"""

SLOW_FILE = f"""\
import pathlib, time
import pytest

@pytest.mark.parametrize("i", range({SLOW_TESTS}))
def test_slow(i):
    time.sleep(1)
    with open(pathlib.Path(__file__).parent / "slow-progress", "a") as out:
        out.write(f"{{i}}\\n")
"""


def make_test_options() -> list[str]:
    """The pytest options `make test` uses, asked of the Makefile itself."""
    if shutil.which("make") is None:
        pytest.skip("no `make` on PATH to ask for `make test`'s pytest options")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(ROOT), "pytest-options"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return shlex.split(out)


def run_session(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Runs pytest in its own process group (its workers too), killed whole if it outlives TIMEOUT_S."""
    start = time.monotonic()
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(
            f"the session with a crashed worker did not end within {TIMEOUT_S} s (a hang); its output:\n{output}"
        )
    finally:
        try:  # a worker left behind by the controller
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, output, time.monotonic() - start


def run_crash_session(tmp_path: Path, crash: str, other_file: str) -> tuple[str, float]:
    """`make test`'s pytest on test_crash.py (its worker dies by `crash`) and test_other.py: its
    output, and the seconds from the worker's death to the session's end (its workers' start,
    slow on a loaded machine, is not the crash's to answer for)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no other project's settings
    (tmp_path / "test_crash.py").write_text(CRASH_FILE.format(crash=CRASHES[crash]))
    (tmp_path / "test_other.py").write_text(other_file)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not the outer session's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # -p tests.xdist_crash
    args = [sys.executable, "-m", "pytest", *make_test_options(), "-p", "no:cacheprovider"]
    code, output, _ = run_session(args, tmp_path, env)
    ended = time.time()
    assert code != 0, f"exit code 0 after a crashed worker:\n{output}"
    assert "crashed while running 'test_crash.py::test_crash'" in output, f"the crashed test is not named:\n{output}"
    return output, ended - float((tmp_path / "crashed-at").read_text())


@pytest.mark.parametrize("crash", sorted(CRASHES))
def test_a_crashed_worker_stops_the_other_one(crash: str, tmp_path: Path) -> None:
    output, elapsed = run_crash_session(tmp_path, crash, SLOW_FILE)
    progress = tmp_path / "slow-progress"
    slow_ran = len(progress.read_text().split()) if progress.exists() else 0
    assert slow_ran < SLOW_TESTS, f"the other worker ran its whole file ({slow_ran} tests, {elapsed:.0f} s):\n{output}"
    assert elapsed < SESSION_LIMIT_S, f"the session ended {elapsed:.0f} s after the worker died:\n{output}"


def test_a_crashed_worker_is_not_replaced(tmp_path: Path) -> None:
    """With the other worker idle (its file done), nothing stops xdist from re-running the crashed
    test's file on replacement workers, up to --max-worker-restart's default of 8: minutes each for
    a long test. `make test` allows no restart."""
    output, elapsed = run_crash_session(tmp_path, "segfault", "def test_quick():\n    pass\n")
    # One report line per crash (the short summary repeats it, cut to the terminal's width or not).
    crashes = len(re.findall(r"^worker 'gw\d+' crashed while running 'test_crash\.py::test_crash'$", output, re.M))
    assert crashes == 1, f"the crashing test ran {crashes} times:\n{output}"
    assert elapsed < SESSION_LIMIT_S, f"the session ended {elapsed:.0f} s after the worker died:\n{output}"
