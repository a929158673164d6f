"""`mirai events` (a day's or range's events and daily quads without Dagster) and `mirai mirror
generate --scale`, run as a user runs them: subprocesses, a mirror served on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import dagster as dg
import pytest

from assets.events import daily_quads, events
from assets.resources import resources_for
from pipeline.storage import read_parquet_metadata

from .conftest import MIRROR_DAY
from .settings_builder import make_settings
from .test_cli import run

FIRST, SECOND = date(2024, 1, 1), date(2024, 1, 2)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path: what a build left behind, bytes and all."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _ingest(data: Path, base_url: str, first: date, last: date) -> None:
    ingest = run(
        "ingest", "--day", str(first), "--end", str(last), env={"MIRAI_DATA_DIR": str(data), "GDELT_BASE_URL": base_url}
    )
    assert ingest.returncode == 0, ingest.stderr


def _materialise_events(data: Path, days: list[date]) -> None:
    """The `events` and `daily_quads` assets, one day after the other, as the UI's re-runs oldest first."""
    with dg.instance_for_test() as instance:
        for day in days:
            result = dg.materialize(
                [events, daily_quads],
                partition_key=day.isoformat(),
                resources=resources_for(make_settings(data_dir=str(data))),
                instance=instance,
            )
            assert result.success


def _built_alike(ingested: Path, tmp_path: Path, days: list[date]):
    """The ingested data built by `mirai events` over ``days`` and, in a copy, by the assets; returns
    the command's result and both trees."""
    by_command, by_assets = tmp_path / "by-command", tmp_path / "by-assets"
    shutil.copytree(ingested, by_command)
    shutil.copytree(ingested, by_assets)
    built = run("events", "--day", str(days[0]), "--end", str(days[-1]), env={"MIRAI_DATA_DIR": str(by_command)})
    _materialise_events(by_assets, days)
    return built, _files(by_command), _files(by_assets)


@pytest.fixture(scope="module")
def ingested_range(tmp_path_factory) -> Path:
    """Two generated days (a tenth of GDELT's volume, to stay fast) landed and parsed by `mirai ingest`."""
    from testbed.generate import MirrorOptions, generate_mirror
    from testbed.serve import MirrorServer

    mirror, data = tmp_path_factory.mktemp("mirror-2-days"), tmp_path_factory.mktemp("ingested") / "data"
    generate_mirror(mirror, FIRST, SECOND, seed=3, options=MirrorOptions(event_scale=0.1))
    with MirrorServer(mirror) as server:
        _ingest(data, server.base_url, FIRST, SECOND)
    return data


def test_events_command_writes_the_bytes_the_assets_write(tmp_path, mirror):
    """The conftest's generated day at GDELT's volume: `mirai ingest`, then `mirai events` on one copy
    and the `events` and `daily_quads` assets on another leave the same files, byte for byte."""
    ingested = tmp_path / "ingested"
    _ingest(ingested, mirror.base_url, MIRROR_DAY, MIRROR_DAY)
    built, by_command, by_assets = _built_alike(ingested, tmp_path, [MIRROR_DAY])
    assert built.returncode == 0, built.stderr
    for made in ("events", "daily_quads", "reports/unmapped_codes", "keys/events"):
        assert f"{made}/date={MIRROR_DAY}.parquet" in by_command, sorted(by_command)
    assert by_command == by_assets
    day_line, summary = built.stdout.splitlines()
    events_meta = read_parquet_metadata(tmp_path / "by-command" / "events" / f"date={MIRROR_DAY}.parquet")
    assert day_line.startswith(f"{MIRROR_DAY}: events kept=")
    assert f" of {events_meta['input_rows']} rows, excluded=" in day_line and "actor_blank=" in day_line
    assert ", quads=" in day_line and day_line.endswith("history_days=0")
    assert summary.startswith(f"built events and daily quads of {MIRROR_DAY} in ")


def test_events_command_builds_a_range_oldest_first(ingested_range, tmp_path):
    """Day 2's rules 1 and 6 read day 1's keys: built oldest first, the range gives what the assets
    give run day after day (built newest first, day 2 would have no history and differ)."""
    built, by_command, by_assets = _built_alike(ingested_range, tmp_path, [FIRST, SECOND])
    assert built.returncode == 0, built.stderr
    assert by_command == by_assets
    first, second, summary = built.stdout.splitlines()
    assert first.startswith(f"{FIRST}: ") and first.endswith("history_days=0")
    assert second.startswith(f"{SECOND}: ") and second.endswith("history_days=1")
    assert summary.startswith(f"built events and daily quads of {FIRST}..{SECOND} (2 days) in ")
    meta = read_parquet_metadata(tmp_path / "by-command" / "events" / f"date={SECOND}.parquet")
    assert meta["history_through"] == str(FIRST)
    kept = sum(int(line.split("events kept=")[1].split()[0]) for line in (first, second))
    assert f": {kept} events, " in summary


def test_events_command_bad_input_is_one_line_and_a_range_stops_at_the_first_missing_day(ingested_range, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(ingested_range, data)
    env = {"MIRAI_DATA_DIR": str(data)}
    cases = [
        (["--day", "2024-01-32"], 2, "argument --day: expected YYYY-MM-DD, got '2024-01-32'"),
        (["--day", str(SECOND), "--end", str(FIRST)], 2, f"--end {FIRST} is before --day {SECOND}: nothing to do"),
        (
            ["--day", "2024-01-05"],
            1,
            f"2024-01-05: no parsed export or mentions files under {data / 'parsed'}: run `mirai ingest "
            "--day 2024-01-05` first; built no day, not built 2024-01-05",
        ),
    ]
    for args, status, message in cases:
        result = run("events", *args, env=env)
        assert result.returncode == status, (args, result.stderr)
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, (args, result.stderr)
        assert result.stderr.startswith("mirai events: error: ") and message in result.stderr, (args, result.stderr)
    assert not (data / "events").exists()  # nothing was built by the refused runs

    # Day 3 was never ingested: day 2 is built, then the range stops and says which days were not.
    stopped = run("events", "--day", str(SECOND), "--end", "2024-01-04", env=env)
    assert stopped.returncode == 1 and len(stopped.stderr.splitlines()) == 1, stopped.stderr
    assert "2024-01-03: no parsed export or mentions files" in stopped.stderr
    assert stopped.stderr.rstrip().endswith(f"built {SECOND}, not built 2024-01-03..2024-01-04 (2 days)")
    assert [line.split(":")[0] for line in stopped.stdout.splitlines()] == [str(SECOND)]
    assert sorted(p.name for p in (data / "events").iterdir()) == [f"date={SECOND}.parquet"]

    # A day whose mentions were not parsed would give quads with no mentions: refused, named.
    shutil.rmtree(data / "parsed" / "mentions" / f"date={FIRST}")
    result = run("events", "--day", str(FIRST), env=env)
    assert result.returncode == 1 and f"{FIRST}: no parsed mentions files under" in result.stderr


def _export_rows(mirror: Path) -> int:
    return json.loads((mirror / "manifest.json").read_text())["totals"]["export"]["valid_rows"]


def test_mirror_generate_scale_writes_fewer_events_and_refuses_a_bad_share(tmp_path):
    day = ["--start", "2024-01-01", "--end", "2024-01-01", "--slots", "8"]
    for name, scale in (("default", []), ("full", ["--scale", "1"]), ("half", ["--scale", "0.5"])):
        result = run("mirror", "generate", *day, "--out", str(tmp_path / name), *scale)
        assert result.returncode == 0, result.stderr
    # --scale 1 is the default mirror, byte for byte (its manifest records no options).
    assert _files(tmp_path / "full") == _files(tmp_path / "default")
    half, full = _export_rows(tmp_path / "half"), _export_rows(tmp_path / "full")
    assert 0.4 * full < half < 0.6 * full, (half, full)
    manifest = json.loads((tmp_path / "half" / "manifest.json").read_text())
    assert manifest["options"]["event_scale"] == 0.5

    for bad in ("0", "1.5", "-1", "half"):
        result = run("mirror", "generate", *day, "--out", str(tmp_path / "bad"), "--scale", bad)
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("mirai mirror generate: error: argument --scale: expected ")
    assert not (tmp_path / "bad").exists()
    help_text = run("mirror", "generate", "--help").stdout
    assert "--scale" in help_text and "share of GDELT's events per 15-minute slot" in help_text
