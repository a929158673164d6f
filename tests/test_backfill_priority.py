"""Issue 36, point 2: a backfill never delays a live tick's run by more than one running backfill
run. Under the real daemon on deploy/dagster-local.yaml, a 30-day backfill of `gdelt_ingest` is
queued (all 30 runs at once, as the UI and `dagster job backfill` do), then the run that the
15-minute schedule requests (its own tags, taken from the schedule) is submitted: it must get the
`gdelt_http` slot after at most the one backfill download in progress."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from sensors.schedules import gdelt_every_15_minutes
from testbed.dagster_services import BIN, running_daemon
from testbed.generate import MirrorOptions, generate_mirror
from testbed.serve import MirrorServer

from .conftest import ROOT

BACKFILL = [date(2024, 1, 1) + timedelta(days=i) for i in range(30)]
LIVE_DAY = date(2024, 1, 31)


@pytest.fixture(scope="module")
def month_mirror(tmp_path_factory):
    out = tmp_path_factory.mktemp("month-mirror")
    generate_mirror(out, BACKFILL[0], LIVE_DAY, seed=5, options=MirrorOptions(event_scale=0.02))
    with MirrorServer(out) as server:
        yield server


def _dagster(env: dict, *args: str) -> None:
    subprocess.run([str(BIN / "dagster"), *args], cwd=ROOT, env=env, check=True, capture_output=True, timeout=180)


def _why(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """The failure events of ``run`` (a CI failure under load left nothing else to read)."""
    kinds = {dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.ENGINE_EVENT}
    return " | ".join(
        entry.user_message[:300]
        for entry in instance.all_logs(run.run_id)
        if entry.dagster_event is not None and entry.dagster_event.event_type in kinds
    )


def _step_time(instance, run_id: str, event_type, step: str = "gdelt_files") -> float | None:
    times = [e.timestamp for e in instance.all_logs(run_id, of_type=event_type) if e.step_key == step]
    return min(times) if times else None


def test_a_30_day_backfill_lets_the_live_run_download_next(tmp_path, month_mirror):
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-local.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MIRAI_DATA_DIR": str(data),
        "GDELT_BASE_URL": month_mirror.base_url,
        "MIRAI_BACKOFF_BASE_S": "0.01",
    }
    tick = datetime.combine(LIVE_DAY, datetime.min.time(), UTC).replace(hour=12, minute=5)
    live = gdelt_every_15_minutes(dg.build_schedule_context(scheduled_execution_time=tick))[0]
    with dg.DagsterInstance.from_config(str(home)) as instance, running_daemon(env) as daemon:
        _dagster(env, "job", "backfill", "-w", "workspace.yaml", "-j", "gdelt_ingest", "--noprompt",
                 "--from", BACKFILL[0].isoformat(), "--to", BACKFILL[-1].isoformat())  # fmt: skip
        deadline = time.monotonic() + 180
        while not instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            assert daemon.poll() is None and time.monotonic() < deadline, "the backfill did not start"
            time.sleep(0.5)
        _dagster(env, "job", "launch", "-w", "workspace.yaml", "-j", "gdelt_ingest", "--tags",
                 json.dumps({**live.tags, "dagster/partition": live.partition_key}))  # fmt: skip
        (live_run,) = [r for r in instance.get_runs() if r.tags.get("dagster/partition") == LIVE_DAY.isoformat()]
        # From the moment the live run is queued: `dagster job launch` itself takes seconds to load
        # the code location, during which the backfill rightly goes on.
        queued_at = instance.get_run_record_by_id(live_run.run_id).create_timestamp.timestamp()
        deadline = time.monotonic() + 240
        while instance.get_run_by_id(live_run.run_id).status != dg.DagsterRunStatus.SUCCESS:
            assert daemon.poll() is None and time.monotonic() < deadline, "the live run did not finish"
            assert not instance.get_run_by_id(live_run.run_id).is_finished, (
                f"the live run failed: {_why(instance, live_run)}"
            )
            time.sleep(0.5)
        live_download = _step_time(instance, live_run.run_id, dg.DagsterEventType.STEP_START)
        backfill_runs = [r for r in instance.get_runs() if "dagster/backfill" in r.tags]
        downloads_before = [
            done
            for r in backfill_runs
            if (done := _step_time(instance, r.run_id, dg.DagsterEventType.STEP_SUCCESS)) is not None
            and queued_at < done <= live_download
        ]
        finished = sum(r.is_finished for r in (instance.get_run_by_id(r.run_id) for r in backfill_runs))
        print(
            f"live run downloaded after {len(downloads_before)} backfill download(s); {finished}/30 backfill runs done"
        )
        assert len(backfill_runs) == len(BACKFILL)
        assert len(downloads_before) <= 1
        assert finished < len(BACKFILL) // 2  # the backfill was still going: the live run did not just wait it out
