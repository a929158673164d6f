"""Warm spares (issue 18, a sandbox that starts in a blink): a child started ahead of need, its
imports done, waiting for one episode (pipeline/agent_api/sandbox.py, SparePool).

A spare must hold nothing of any cutoff until an episode is handed to it, and then only that
episode's table files, never the socket they came over; agent code that owns the interpreter (the
bypass of test_sandbox_attacks.py) must not reach the waiting spare, a sibling sandbox or the
evaluation process (signals, ptrace, process_vm_readv, pidfd_open, /proc); and nothing it does
can reach the next episode, which runs in another spare.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pytest

from pipeline.agent_api import EventDatabase, cutoff_gate
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.agent_api.sandbox_spares import SPARES
from testbed.database import generate_event_database
from tests.test_sandbox_attacks import BYPASS, RUN_ATTACKS, _nr

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or machine() not in SECCOMP_ARCHES,
    reason=f"the sandbox's OS layer is built for Linux {', '.join(SECCOMP_ARCHES)}",
)
QUERY = date(2023, 12, 10)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("spares-db")
    generate_event_database(root, date(2023, 11, 1), 2, seed=13, quads_per_day=20)
    database = EventDatabase(root)
    yield database
    database.table_files.close()


def _interpreter(pid: int) -> int:
    """The sandbox child of the process ``pid`` the parent holds (sandbox_child.fork_spare: it forks
    the sandbox child just after it starts, and waits for it)."""
    while True:
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except (OSError, ValueError):
                continue
            if entry.name.isdigit() and int(stat.rpartition(")")[2].split()[1]) == pid:
                return int(entry.name)
        time.sleep(0.01)


def _descriptors(pid: int) -> list[str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    return [os.readlink(fd_dir / name) for name in os.listdir(fd_dir)]


def _alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _child_pid(env) -> int:
    return env._sandbox._child.proc.pid


def test_a_waiting_spare_holds_no_table_and_is_handed_only_its_episodes_files(db):
    env = db.environment(QUERY)
    assert env.run_code("1").strip() == "1"
    [spare] = _warm_pool((), 1)  # the successor, started once this episode's spare had started
    spare_python = _interpreter(spare)
    waiting = _descriptors(spare_python)
    assert not [d for d in waiting if d.endswith(".arrow")], waiting
    assert len([d for d in waiting if d.startswith("socket:")]) == 1, waiting  # the handover socket
    assert not [line for line in Path(f"/proc/{spare_python}/maps").read_text().splitlines() if ".arrow" in line]
    # The episode's child: its parts only, and no socket (the one its episode came over is closed).
    own_parts = {str(path) for part in db.gated_files(QUERY - timedelta(days=1)) for path in part}
    held = _descriptors(_interpreter(_child_pid(env)))
    assert not [d for d in held if d.startswith("socket:")], held
    assert {d for d in held if d.endswith(".arrow")} <= own_parts, held
    env.close()
    # The next episode (another cutoff) is served by that spare, and gets that cutoff's parts.
    later = db.environment(QUERY + timedelta(days=10))
    assert later.run_code("count_events() > 0").strip() == "True"
    assert _child_pid(later) == spare
    later_parts = {str(path) for part in db.gated_files(QUERY + timedelta(days=9)) for path in part}
    assert {d for d in _descriptors(spare_python) if d.endswith(".arrow")} <= later_parts
    later.close()


def test_agent_code_reaches_neither_the_spare_nor_a_sibling_nor_the_parent(db, tmp_path, monkeypatch):
    """Signals (SIGKILL to the spare and the sibling, signal 0 to probe everyone else), ptrace,
    process_vm_readv, pidfd_open and /proc of each: all refused, and every target lives on. The
    sibling, of another cutoff, is under a gate of its own (one gate would not let it exist beside
    the attacker), so that the kernel layers alone are attacked."""
    attacker, sibling = db.environment(QUERY), db.environment(QUERY + timedelta(days=5))
    with monkeypatch.context() as patch:  # a Sandbox takes the module's gate when it is made
        patch.setattr(cutoff_gate, "CUTOFF_GATE", cutoff_gate.CutoffGate(tmp_path / "sibling-gate"))
        assert sibling.run_code("x = 41").strip() == ""
    assert attacker.run_code(BYPASS).strip() == "guards off"
    [spare] = _warm_pool((), 1)
    targets = {
        "spare": spare,
        "spare_python": _interpreter(spare),
        "sibling": _child_pid(sibling),
        "sibling_python": _interpreter(_child_pid(sibling)),
        "template": SPARES._templates[()].proc.pid,
        "parent": os.getpid(),
    }
    buffer = "B:64"
    attacks = []
    for name, pid in targets.items():
        kill = int(signal.SIGKILL) if name != "parent" else 0
        attacks += [
            (f"kill:{name}", _nr("kill"), [pid, kill]),
            (f"tgkill:{name}", _nr("tgkill"), [pid, pid, kill]),
            (f"ptrace_attach:{name}", _nr("ptrace"), [PTRACE_ATTACH, pid, 0, 0]),
            (f"ptrace_seize:{name}", _nr("ptrace"), [PTRACE_SEIZE, pid, 0, 0]),
            (f"pidfd_open:{name}", _nr("pidfd_open"), [pid, 0]),
            (f"process_vm_readv:{name}", _nr("process_vm_readv"), [pid, buffer, 1, buffer, 1, 0]),
            (f"proc_mem:{name}", _nr("openat"), [-100, f"P:/proc/{pid}/mem", os.O_RDONLY, 0]),
        ]
    # The process group and every process, probed with signal 0 only (harmless if it got through).
    attacks += [("kill:group", _nr("kill"), [0, 0]), ("kill:everyone", _nr("kill"), [-1, 0])]
    observation = attacker.run_code(f"ATTACKS = {attacks!r}\n" + RUN_ATTACKS, timeout_s=60)
    results = {label: (int(rc), int(err)) for label, rc, err in (line.split() for line in observation.splitlines())}
    assert len(results) == len(attacks), observation
    assert {label: got for label, got in results.items() if got != (-1, errno.EPERM)} == {}, observation
    assert all(_alive(pid) for pid in targets.values()), targets
    assert sibling.run_code("x + 1").strip() == "42"
    # The attacked spare still serves the next episode.
    attacker.close()
    sibling.close()
    following = db.environment(QUERY)
    assert following.run_code("count_events() > 0").strip() == "True"
    assert _child_pid(following) == spare
    following.close()


def test_nothing_an_episode_does_persists_into_the_next(db):
    """An episode with the guards off plants state everywhere its process can write: module
    attributes, builtins, its environment variables, its globals; the next episode, in another
    spare, sees none of it."""
    first = db.environment(QUERY)
    assert first.run_code(BYPASS).strip() == "guards off"
    plant = (
        "_sys.modules['pipeline.agent_api.lookup'].PLANTED = 'from episode 1'\n"
        "_B['PLANTED'] = 'from episode 1'\n"
        "_sys.modules['os'].environ['PLANTED'] = 'from episode 1'\n"
        "_sys.modules['builtins'].PLANTED = 'from episode 1'\n"
        "planted = 'from episode 1'\n"
        "print('planted', _sys.modules['os'].getpid())"
    )
    assert first.run_code(plant).split()[0] == "planted"
    first_pid = _child_pid(first)
    first.close()
    assert not _alive(first_pid)
    following = db.environment(QUERY)
    assert following.run_code(BYPASS).strip() == "guards off"
    found = following.run_code(
        "print(hasattr(_sys.modules['pipeline.agent_api.lookup'], 'PLANTED'), 'PLANTED' in _B,"
        " 'PLANTED' in _sys.modules['os'].environ, hasattr(_sys.modules['builtins'], 'PLANTED'),"
        " 'planted' in globals())"
    )
    assert found.split() == ["False"] * 5, found
    assert _child_pid(following) != first_pid
    following.close()


def test_a_spare_that_died_waiting_is_replaced(db):
    env = db.environment(QUERY)
    assert env.run_code("1").strip() == "1"
    env.close()
    [spare] = _warm_pool((), 1)
    os.kill(spare, signal.SIGKILL)
    while _alive(spare):  # unreaped: a zombie until the pool looks
        time.sleep(0.01)
    again = db.environment(QUERY)
    assert again.run_code("count_events() > 0").strip() == "True"
    assert _child_pid(again) != spare
    again.close()


def _threads(pid: int) -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()]


def test_the_template_holds_nothing_and_its_spares_die_with_it(db):
    """The template every spare is forked from holds its control socket and nothing else, has not
    started polars' thread pool (a forked child could not use it), and shares no namespace with its
    spares, which die with it; the next episode gets a fresh template."""
    env = db.environment(QUERY)
    assert env.run_code("1").strip() == "1"
    [spare] = _warm_pool((), 1)
    template = SPARES._templates[()].proc.pid
    held = _descriptors(template)
    assert len([d for d in held if d.startswith("socket:")]) == 1 and not [d for d in held if ".arrow" in d], held
    pool = re.compile(r"polars-\d+$|tokio-")  # polars' thread pool, its async runtime
    assert not [name for name in _threads(template) if pool.match(name)], _threads(template)
    assert [name for name in _threads(_interpreter(spare)) if pool.match(name)]  # its own, started after the fork
    for kind in ("user", "mnt", "pid", "net", "ipc"):
        namespaces = {os.readlink(f"/proc/{pid}/ns/{kind}") for pid in (template, _interpreter(spare))}
        assert len(namespaces) == 2 or "unavailable" in env.sandbox_report["namespaces"], kind
    forked = [spare, _interpreter(spare), _child_pid(env), _interpreter(_child_pid(env))]
    os.kill(template, signal.SIGKILL)
    for pid in forked:
        while _alive(pid):
            time.sleep(0.01)
    assert "SandboxError" in env.run_code("1")  # the running episode's child died with the template
    env.close()
    again = db.environment(QUERY)
    assert again.run_code("count_events() > 0").strip() == "True"
    assert SPARES._templates[()].proc.pid != template
    again.close()


def _warm_pool(libraries: tuple[str, ...], n: int) -> list[int]:
    """Wait until ``n`` spares for ``libraries`` wait warm, checking all along that at most one is
    importing; their pids."""
    while True:
        spares = SPARES.waiting(libraries)
        assert sum(not warm for _, warm in spares) <= 1
        if len(spares) == n and all(warm for _, warm in spares):
            return [pid for pid, _ in spares]
        time.sleep(0.01)


def test_a_reserved_pool_is_started_one_spare_at_a_time_and_shrinks_when_released(db):
    """An evaluation reserves a spare per live sandbox: the starter brings them up one at a time
    (never two importing side by side, so running episodes keep a core), refills what an episode
    takes, and a release stops the surplus."""
    libraries = ("numpy",)
    SPARES.reserve(libraries, 3)
    try:
        pids = _warm_pool(libraries, 3)
        env = db.environment(QUERY, code_libraries=libraries)
        assert env.run_code("import numpy\nint(numpy.arange(4).sum())").strip() == "6"
        assert _child_pid(env) in pids  # a warm one served the episode
        env.close()
        pids = _warm_pool(libraries, 3)
    finally:
        SPARES.release(libraries, 3)
    left = [pid for pid, _ in SPARES.waiting(libraries)]
    assert len(left) == 1 and set(left) <= set(pids)
    assert not any(_alive(pid) for pid in set(pids) - set(left))


EXIT_WHILE_STARTING = """
import sys, time
from pipeline.agent_api.sandbox_spares import SPARES
SPARES.reserve((), 3)
moment = sys.argv[1]
while moment == "template" and () not in SPARES._templates:
    time.sleep(0.001)
while moment == "spare" and not any(not warm for _, warm in SPARES.waiting(())):
    time.sleep(0.001)
"""


@pytest.mark.parametrize("moment", ["at once", "template", "spare"])
def test_a_process_that_exits_while_its_spares_start_says_nothing(moment):
    """A run that ends while the starter is forking spares (`mirai evaluate` refused by its
    endpoint at the first request) exits quietly: the pool's close at exit and the starter's
    failed fork may stop the same template, and close a socket the starter is reading."""
    for _ in range(3):
        ended = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_STARTING, moment], capture_output=True, text=True, timeout=60
        )
        assert (ended.returncode, ended.stderr) == (0, "")


def test_each_live_sandboxs_spare_counts_in_the_memory_bound(monkeypatch):
    """sandbox_slots leaves room for a spare beside each live sandbox and counts the shared tables
    and code once: with memory for exactly 4 such pairs, 4 are allowed, whatever the concurrency."""
    from pipeline.evaluation import throughput
    from pipeline.evaluation.episodes import sandbox_slots

    tables_mb = 100.0
    pair_mb = throughput.sandbox_start_mb(tables_mb) + throughput.SPARE_PRIVATE_MB + 1024
    shared_mb = tables_mb + throughput.SANDBOX_SHARED_MB
    available = int((4 * pair_mb + shared_mb) * 2**20 / throughput.MEMORY_HEADROOM) + 2**20
    monkeypatch.setattr(throughput, "available_memory_bytes", lambda: available)
    assert sandbox_slots(16, tables_mb, 1024).n == 4
    assert sandbox_slots(3, tables_mb, 1024).n == 3


def test_a_backward_handover_replaces_the_spares_that_warmed_up_beside_the_later_cutoff(tmp_path):
    """A spare that warmed up while a later cutoff's sandboxes ran carries how long that took in its
    own CPU clock, which the earlier cutoff's episode it serves may read: at a backward handover the
    gate stops the waiting spares and the starter brings up new ones; a forward one keeps them."""
    gate = cutoff_gate.CutoffGate(tmp_path / "gate", handover_grid_s=0)
    SPARES.reserve((), 1)
    try:
        [before] = _warm_pool((), 1)
        for cutoff in (QUERY, QUERY + timedelta(days=5)):  # forward
            with gate.hold(cutoff):
                pass
        assert _warm_pool((), 1) == [before]
        with gate.hold(QUERY):  # backward
            pass
        [after] = _warm_pool((), 1)
        assert after != before and not Path(f"/proc/{before}").exists()
    finally:
        SPARES.release((), 1)
