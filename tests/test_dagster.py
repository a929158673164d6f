"""The Dagster side, for real: materialize on a real instance, the dagster CLI, definitions
validation, the 15-minute schedule's targets, and the webserver listing it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import requests

from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.resources import resources_for
from pipeline.gdelt.ledger import read_ledger
from pipeline.storage import DataLayout

from .conftest import MIRROR_DAY, ROOT
from .settings_builder import make_settings
from .table_metadata import table_text
from .test_pictures_ops import metadata_png

BIN = Path(sys.executable).parent


def _env(tmp_path: Path, mirror) -> dict[str, str]:
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MIRAI_DATA_DIR": str(tmp_path / "data"),
        "GDELT_BASE_URL": mirror.base_url,
        "MIRAI_BACKOFF_BASE_S": "0.01",
    }


def _expected_rows(mirror_dir: Path, kind: str) -> int:
    manifest = json.loads((mirror_dir / "manifest.json").read_text())
    return sum(s[kind]["valid_rows"] for s in manifest["slots"] if s[kind]["listed"])


def test_materialize_a_day_on_a_real_instance(tmp_path, mirror, mirror_dir):
    resources = resources_for(make_settings(data_dir=str(tmp_path / "data"), gdelt_base_url=mirror.base_url))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads],
            partition_key=MIRROR_DAY.isoformat(),
            resources=resources,
            instance=instance,
        )
        assert result.success
        files_meta = result.asset_materializations_for_node("gdelt_files")[0].metadata
        ledger = read_ledger(DataLayout(tmp_path / "data"), MIRROR_DAY)
        assert files_meta["files_landed"].value == ledger.filter(pl.col("listed")).height
        assert files_meta["files_corrupt"].value == 0 and files_meta["files_failed"].value == 0
        # The month so far as a picture, inline: the day is its last row (tests/test_pictures_ops.py).
        assert metadata_png(files_meta["ledger_month"].value).shape == (700, 1200, 4)
        events_meta = result.asset_materializations_for_node("gdelt_events")[0].metadata
        assert events_meta["dagster/row_count"].value == _expected_rows(mirror_dir, "export")
        mentions_meta = result.asset_materializations_for_node("gdelt_mentions")[0].metadata
        assert mentions_meta["dagster/row_count"].value == _expected_rows(mirror_dir, "mentions")
        # Every exclusion reason is counted in the UI; the rows add up.
        ev_meta = result.asset_materializations_for_node("events")
        ev = next(m for m in ev_meta if m.asset_key == dg.AssetKey("events")).metadata
        excluded = sum(v.value for k, v in ev.items() if k.startswith("excluded_"))
        assert (
            ev["dagster/row_count"].value + excluded == ev["input_rows"].value == _expected_rows(mirror_dir, "export")
        )
        assert ev["rules_version"].value == "rules-v1"
        quads_meta = result.asset_materializations_for_node("daily_quads")[0].metadata
        assert quads_meta["quads_ge_50_mentions"].value > 0
        # The materialisation is recorded in the instance, per partition.
        record = instance.get_latest_materialization_event(dg.AssetKey("gdelt_files"))
        assert record.dagster_event.partition == MIRROR_DAY.isoformat()


def test_dagster_cli_materializes_and_mirai_ledger_prints_it(tmp_path, mirror, mirror_dir):
    env = _env(tmp_path, mirror)
    proc = subprocess.run(
        [
            str(BIN / "dagster"),
            "asset",
            "materialize",
            "-m",
            "definitions",
            "--select",
            "gdelt_files,gdelt_events,gdelt_mentions",
            "--partition",
            MIRROR_DAY.isoformat(),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pl.scan_parquet(DataLayout(tmp_path / "data").parsed_dir("export", MIRROR_DAY) / "*.parquet")
    assert rows.select(pl.len()).collect().item() == _expected_rows(mirror_dir, "export")
    out = subprocess.run(
        [str(BIN / "mirai"), "ledger", "--day", MIRROR_DAY.isoformat()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "landed=" in out.stdout and "missing=" in out.stdout
    # The gaps the generator left out of the index are named in the report.
    assert "missing" in out.stdout.split("\n", 1)[1]


def test_definitions_validate():
    proc = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        (datetime(2024, 3, 10, 23, 50, tzinfo=UTC), ["2024-03-10"]),
        # 00:05: the 00:00 slot of the new day is out, and the previous day is reconciled.
        (datetime(2024, 3, 11, 0, 5, tzinfo=UTC), ["2024-03-11", "2024-03-10"]),
        (datetime(2024, 3, 11, 0, 20, tzinfo=UTC), ["2024-03-11"]),
        (datetime(2024, 3, 11, 7, 5, tzinfo=UTC), ["2024-03-11"]),
    ],
)
def test_schedule_targets_the_right_day(tick, expected):
    from definitions import defs
    from sensors.schedules import gdelt_every_15_minutes

    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(
            instance=instance, scheduled_execution_time=tick, repository_def=defs.get_repository_def()
        ) as context:
            requests_ = list(gdelt_every_15_minutes.evaluate_tick(context).run_requests)
    assert [r.partition_key for r in requests_] == expected
    assert len({r.run_key for r in requests_}) == len(requests_)
    assert gdelt_every_15_minutes.cron_schedule == "5,20,35,50 * * * *"
    assert gdelt_every_15_minutes.execution_timezone == "UTC"


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        (datetime(2024, 3, 10, 23, 40, tzinfo=UTC), ["2024-03-10"]),
        (datetime(2024, 3, 11, 0, 40, tzinfo=UTC), ["2024-03-11", "2024-03-10"]),
        (datetime(2024, 3, 11, 13, 40, tzinfo=UTC), ["2024-03-11"]),
    ],
)
def test_articles_schedule_targets_the_day_and_finishes_the_previous_one(tick, expected):
    from definitions import defs
    from sensors.schedules import articles_hourly

    with dg.instance_for_test() as instance:
        with dg.build_schedule_context(
            instance=instance, scheduled_execution_time=tick, repository_def=defs.get_repository_def()
        ) as context:
            requests_ = list(articles_hourly.evaluate_tick(context).run_requests)
    assert [r.partition_key for r in requests_] == expected
    assert articles_hourly.job_name == "articles_daily"


INSTIGATORS = {
    "gdelt_every_15_minutes",
    "articles_hourly",
    "monthly_release_daily",
    "live_round_daily",
    "live_history_daily",
    "alert_on_run_failure",
    "gdelt_freshness",
    "evaluation_sensor",
    "submission_sensor",
    "live_resolution_sensor",
    "run_worker_watch",
    "events_follow_history",
    "alert_on_articles_fetch_failing",
}


def test_every_schedule_and_sensor_says_what_it_does():
    """The UI shows a schedule's or sensor's description on its page: every one has one, and each
    of these says whether it starts on or off by default (and why)."""
    from definitions import defs

    with dg.instance_for_test():
        repository = defs.get_repository_def()
    instigators = {i.name: i for i in [*repository.schedule_defs, *repository.sensor_defs]}
    assert INSTIGATORS <= set(instigators)
    assert [name for name, i in instigators.items() if not (i.description or "").strip()] == []
    assert [name for name in sorted(INSTIGATORS) if "by default" not in instigators[name].description] == []
    # And every job they launch, on its page and in the Jobs list.
    assert [job.name for job in defs.jobs if not (job.description or "").strip()] == []


def test_every_asset_and_job_has_an_owner():
    """The UI's Owner column and filter: every asset and job names who answers for it, one of the
    owners assets/owners.py defines."""
    from assets.owners import BENCHMARK_OWNERS, DATA_OWNERS
    from definitions import defs

    known = {*DATA_OWNERS, *BENCHMARK_OWNERS}
    specs = defs.resolve_all_asset_specs()
    # A bare AssetSpec and a multi_asset's specs too.
    assert {"fetch_ledger", "events", "unmapped_codes"} <= {s.key.to_user_string() for s in specs}
    assert [s.key.to_user_string() for s in specs if not s.owners or not set(s.owners) <= known] == []
    assert [job.name for job in defs.jobs if not job.owners or not set(job.owners) <= known] == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_webserver_lists_the_schedule(tmp_path):
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    query = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name
        schedules { name cronSchedule executionTimezone pipelineName }
        assetNodes { assetKey { path } } } } } }"""
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                resp = requests.post(f"http://127.0.0.1:{port}/graphql", json={"query": query}, timeout=10)
                nodes = resp.json()["data"]["repositoriesOrError"]["nodes"]
                if nodes:
                    break
            except (requests.ConnectionError, KeyError, TypeError):
                pass
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "webserver did not come up"
            time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=30)
    schedules = {s["name"]: s for n in nodes for s in n["schedules"]}
    assert schedules["gdelt_every_15_minutes"]["cronSchedule"] == "5,20,35,50 * * * *"
    assert schedules["gdelt_every_15_minutes"]["pipelineName"] == "gdelt_ingest"
    assets = {"/".join(a["assetKey"]["path"]) for n in nodes for a in n["assetNodes"]}
    assert {"gdelt_files", "gdelt_events", "gdelt_mentions"} <= assets


def _ledger_check(tmp_path, mirror):
    """gdelt_files and its ledger check materialised on the mirror's day, which succeeds; the check's evaluation."""
    from quality.ingest_checks import gdelt_files_all_green

    resources = resources_for(
        make_settings(data_dir=str(tmp_path / "data"), gdelt_base_url=mirror.base_url, backoff_base_s=0.01)
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [gdelt_files, gdelt_files_all_green],
            partition_key=MIRROR_DAY.isoformat(),
            resources=resources,
            instance=instance,
        )
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def test_ledger_check_passes_on_the_gaps_gdelt_never_published(tmp_path, mirror, mirror_dir):
    """The generated day has GDELT's usual gaps (slots absent from its index): they are counted and
    named as GDELT's own, and the check passes (before: Failed on every day of a healthy demo)."""
    manifest = json.loads((mirror_dir / "manifest.json").read_text())
    unlisted = sum(not s[kind]["listed"] for s in manifest["slots"] for kind in ("export", "mentions"))
    assert unlisted > 0  # the fixture does have gaps
    evaluation = _ledger_check(tmp_path, mirror)
    assert evaluation.passed
    assert evaluation.metadata["gdelt_gaps"].value == unlisted
    assert evaluation.metadata["not_landed"].value == 0
    assert f"{unlisted} slot file(s) not in GDELT's index (not published by GDELT" in evaluation.description


def test_ledger_check_warns_on_a_listed_file_that_did_not_land(tmp_path, mirror, mirror_dir):
    """A file GDELT's index lists but that answers 404 after the grace period should exist: it warns."""
    manifest = json.loads((mirror_dir / "manifest.json").read_text())
    listed = next(s["ts"] for s in manifest["slots"] if s["export"]["listed"])
    mirror.faults.add(match=f"{listed}.export", fault="404")
    evaluation = _ledger_check(tmp_path, mirror)
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["not_landed"].value == 1
    assert "1 file(s) GDELT's index lists are not landed" in evaluation.description
    assert "missing" in table_text(evaluation.metadata["details"])


def test_ledger_check_warns_on_a_corrupt_file(tmp_path, mirror):
    mirror.faults.add(match="20240101101500.export", fault="wrong_bytes")
    evaluation = _ledger_check(tmp_path, mirror)  # the run succeeds: a corrupt file never fails the day
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["corrupt_or_failed"].value == 1
    details = table_text(evaluation.metadata["details"])
    assert "10:15:00" in details and "corrupt" in details
