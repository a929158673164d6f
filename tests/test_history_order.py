"""Issue 36, point 1 (and issue 31, point 2): a day added after the days that follow it.

Each day's events read every earlier day's (rules 1 and 6), so days 3-6 built before days 1-2 hold
events that belong to days 1-2. Under the real daemon, once days 1-2 are built, the
`events_follow_history` sensor rebuilds days 3-6 oldest first by themselves, and all six end
byte-identical to an in-order build. Without the sensor nothing rebuilds them (the test fails).
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import date, timedelta

import dagster as dg
import pytest

from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.resources import resources_for
from pipeline.events import outdated_days
from pipeline.storage import DataLayout
from testbed.generate import MirrorOptions, generate_mirror
from testbed.serve import MirrorServer

from .conftest import ROOT
from .daemon import running_daemon

DAYS = [date(2024, 1, 1) + timedelta(days=i) for i in range(6)]
INGEST = [gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads]
# One sensor tick (30 s) per day rebuilt, and the runs themselves: 130 s measured for 4 days.
FOLLOWED_WITHIN_S = 300


@pytest.fixture(scope="module")
def six_days(tmp_path_factory):
    out = tmp_path_factory.mktemp("six-days")
    generate_mirror(out, DAYS[0], DAYS[-1], seed=3, options=MirrorOptions(event_scale=0.05))
    with MirrorServer(out) as server:
        yield server


def build(days, data, mirror, instance) -> None:
    resources = resources_for(data_dir=str(data), gdelt_base_url=mirror.base_url)
    for day in days:
        result = dg.materialize(INGEST, partition_key=day.isoformat(), resources=resources, instance=instance)
        assert result.success


def outputs(data, day: date) -> tuple[bytes, bytes]:
    layout = DataLayout(data)
    return layout.events_path(day).read_bytes(), layout.daily_quads_path(day).read_bytes()


@pytest.fixture(scope="module")
def in_order(tmp_path_factory, six_days) -> dict[date, tuple[bytes, bytes]]:
    data = tmp_path_factory.mktemp("in-order") / "data"
    with dg.instance_for_test() as instance:
        build(DAYS, data, six_days, instance)
    return {day: outputs(data, day) for day in DAYS}


def test_a_day_added_late_is_followed_by_every_later_day(tmp_path, six_days, in_order):
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-local.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "MIRAI_DATA_DIR": str(data), "GDELT_BASE_URL": six_days.base_url}
    with dg.DagsterInstance.from_config(str(home)) as instance, running_daemon(env) as daemon:
        build(DAYS[2:], data, six_days, instance)
        # The order matters on this data: day 3 built without days 1-2 is not day 3.
        assert outputs(data, DAYS[2])[0] != in_order[DAYS[2]][0]
        build(DAYS[:2], data, six_days, instance)
        started = time.monotonic()
        while any(outputs(data, day) != in_order[day] for day in DAYS):
            assert daemon.poll() is None, "the daemon exited"
            assert time.monotonic() - started < FOLLOWED_WITHIN_S, [
                day.isoformat() for day in DAYS if outputs(data, day) != in_order[day]
            ]
            time.sleep(2)
        followed_after = time.monotonic() - started
        records = instance.get_run_records(
            filters=dg.RunsFilter(tags={"dagster/sensor_name": "events_follow_history"}), ascending=True
        )
        print(f"days 3-6 followed after {followed_after:.0f} s in {len(records)} runs")
        # One day after the other, oldest first.
        first_seen = list(dict.fromkeys(r.dagster_run.tags["dagster/partition"] for r in records))
        assert first_seen == [day.isoformat() for day in DAYS[2:]]


def test_outdated_days_names_the_days_built_before_an_earlier_one(tmp_path, six_days, in_order):
    data = tmp_path / "data"
    with dg.instance_for_test() as instance:
        build(DAYS[2:], data, six_days, instance)
        assert outdated_days(DataLayout(data)) == []
        build(DAYS[:2], data, six_days, instance)
        assert outdated_days(DataLayout(data)) == DAYS[2:]
        build(DAYS[2:3], data, six_days, instance)  # one day followed: the next ones stay outdated
        assert outdated_days(DataLayout(data)) == DAYS[3:]
        assert outputs(data, DAYS[2]) == in_order[DAYS[2]]
