"""A run worker killed mid-step under the real daemon (issue 31): the scenario shared by the SQLite
test (tests/test_run_recovery.py) and the PostgreSQL one (tests/test_postgres.py).

The daemon runs from workspace.yaml on the instance in ``home``, with the shipped instance file.
Run A of `gdelt_ingest` downloads the mirror's day slowly; once it holds the `gdelt_http` slot and
has landed some files, its worker gets SIGKILL (what the OOM killer sends). Run B for the same day is
submitted at once, as the next tick would be: it queues for the slot A still holds. Nobody touches
anything after that. The scenario returns how long each step took, from the kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from pipeline.gdelt.ledger import read_ledger, summarize
from pipeline.storage import DataLayout
from sensors.run_health import run_worker_pid
from testbed.dagster_services import BIN, running_daemon

from .conftest import MIRROR_DAY, ROOT

# docs/operations.md, "A run whose worker died": the watch looks every 30 s; the daemon's sensor loop
# and the run's own start add some seconds. What the test allows from the kill to each event.
FAILED_WITHIN_S = 90
NEXT_RUN_DONE_WITHIN_S = 240


@dataclass
class Recovery:
    killed_run: dg.DagsterRun
    failure_message: str
    next_run: dg.DagsterRun
    landed_before_kill: int
    failed_after_s: float
    next_run_done_after_s: float
    ledger: dict[str, int]


def _launch(env: dict, partition: str) -> None:
    subprocess.run(
        [
            str(BIN / "dagster"),
            "job",
            "launch",
            "-w",
            "workspace.yaml",
            "-j",
            "gdelt_ingest",
            "--tags",
            json.dumps({"dagster/partition": partition}),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )


def _wait(what: str, condition, timeout_s: float, daemon: subprocess.Popen):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert daemon.poll() is None, f"the daemon exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.5)
    return value


def killed_worker_recovers(home: Path, data: Path, mirror, extra_env: dict, *, with_code_server: bool) -> Recovery:
    """``with_code_server``: the code server that started the worker is killed first (the OOM killer's
    other choice, or a reload): then nothing in Dagster itself sees the worker go."""
    env = {
        **os.environ,
        **extra_env,
        "DAGSTER_HOME": str(home),
        "MIRAI_DATA_DIR": str(data),
        "GDELT_BASE_URL": mirror.base_url,
        "MIRAI_BACKOFF_BASE_S": "0.01",
        "MIRAI_DOWNLOAD_CONCURRENCY": "2",
    }
    partition = MIRROR_DAY.isoformat()
    # Each zip in 2 KiB chunks 0.1 s apart: A is still downloading a minute after it starts.
    mirror.faults.add(".zip", "slow", delay_s=0.1, chunk_size=2048)
    old_home = os.environ.get("DAGSTER_HOME")
    os.environ.update({**extra_env, "DAGSTER_HOME": str(home)})
    try:
        with dg.DagsterInstance.get() as instance, running_daemon(env) as daemon:
            earlier = {run.run_id for run in instance.get_runs()}  # a shared database has others

            def new_runs():
                return [run for run in instance.get_runs() if run.run_id not in earlier]

            _launch(env, partition)
            killed = _wait("run A", new_runs, 60, daemon)[0]

            def holds_slot_and_landed():
                info = instance.event_log_storage.get_concurrency_info("gdelt_http")
                landed = sum(1 for r in list(mirror.requests) if r["path"].endswith(".zip"))
                return landed if killed.run_id in {s.run_id for s in info.claimed_slots} and landed >= 4 else 0

            landed_before_kill = _wait("run A in its download step", holds_slot_and_landed, 180, daemon)
            pid, _ = run_worker_pid(instance, killed.run_id)
            if with_code_server:
                code_server = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                os.kill(code_server, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            _launch(env, partition)  # the next tick's run, while A still holds the slot
            mirror.faults.clear()
            next_run = _wait(
                "run B", lambda: next(iter(r for r in new_runs() if r.run_id != killed.run_id), None), 60, daemon
            )

            def status(run):
                return instance.get_run_by_id(run.run_id).status

            _wait("run A marked failed", lambda: status(killed) == dg.DagsterRunStatus.FAILURE, 300, daemon)
            failed_after = time.monotonic() - killed_at
            _wait("run B finished", lambda: status(next_run).value in ("SUCCESS", "FAILURE"), 300, daemon)
            done_after = time.monotonic() - killed_at
            assert status(next_run) == dg.DagsterRunStatus.SUCCESS, [
                (e.dagster_event.event_type_value, e.message[:300])
                for e in instance.all_logs(next_run.run_id)[-15:]
                if e.dagster_event
            ] + [(r.run_id[:8], r.status.value, r.tags.get("dagster/parent_run_id")) for r in new_runs()]
            return Recovery(
                killed_run=instance.get_run_by_id(killed.run_id),
                failure_message=instance.all_logs(killed.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[-1].message,
                next_run=instance.get_run_by_id(next_run.run_id),
                landed_before_kill=landed_before_kill,
                failed_after_s=failed_after,
                next_run_done_after_s=done_after,
                ledger=summarize(read_ledger(DataLayout(data), MIRROR_DAY)),
            )
    finally:
        if old_home is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old_home
        for key in extra_env:
            os.environ.pop(key, None)
