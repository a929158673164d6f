"""The live round through Dagster on real instances: today's round published by the `live_round`
asset on the real clock, a replayed past round and its baseline accepted by the `submission`
asset, and the `live_round_daily` schedule's decisions."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from assets.live import live_round
from assets.resources import resources_for
from assets.submissions import submission
from pipeline.live.rounds import round_seed
from pipeline.storage import DataLayout
from sensors.live import live_round_daily, live_round_job

from .month_builder import write_days
from .settings_builder import make_settings
from .test_live_rounds import DAY, WINDOW, later_quads, window_quads

LIVE = {"live_window_days": 7, "live_round_size": 8, "live_seed": 3}


def test_todays_round_is_published_through_dagster(tmp_path):
    today = datetime.now(UTC).date()
    window = [today - timedelta(days=n) for n in range(7, 0, -1)]
    mirror = "http://mirror.test/gdeltv2"
    resources = resources_for(
        make_settings(
            data_dir=str(tmp_path / "data"), release_uri=str(tmp_path / "bucket"), gdelt_base_url=mirror, **LIVE
        )
    )
    settings_dir = tmp_path / "data"
    write_days(make_settings(data_dir=settings_dir), window, window_quads(window))
    with dg.instance_for_test() as instance:
        result = dg.materialize([live_round], instance=instance, resources=resources, partition_key=today.isoformat())
        assert result.success
        meta = result.asset_materializations_for_node("live_round")[0].metadata
        assert meta["questions"].value == 8 and meta["pairs_active"].value == 3 and meta["pairs_quiet"].value == 1
        assert meta["pool_active"].value == 6 and meta["pool_quiet"].value == 4
        assert meta["deadline"].value == f"{today + timedelta(days=1)}T00:00:00+00:00"
        assert meta["seed"].value == str(round_seed(3, today)) and meta["published_now"].value is True
        assert meta["manifest_key"].value == f"live/rounds/{today}/manifest.json"
    index = json.loads((tmp_path / "bucket" / "live" / "index.json").read_bytes())
    assert [r["round"] for r in index["rounds"]] == [today.isoformat()]
    # The round records the deployment's GDELT feed as its source, as a split does.
    manifest = json.loads((tmp_path / "bucket" / "live" / "rounds" / today.isoformat() / "manifest.json").read_bytes())
    assert manifest["source"]["gdelt_base_url"] == mirror


def test_a_replayed_round_and_its_baseline_through_dagster(tmp_path):
    data = tmp_path / "data"
    write_days(make_settings(data_dir=data), [*WINDOW, DAY, DAY + timedelta(days=1)], window_quads() + later_quads())
    resources = resources_for(make_settings(data_dir=str(data), release_uri=str(tmp_path / "bucket"), **LIVE))
    replay = {"ops": {"live_round": {"config": {"replay_at": "2024-03-10T02:00:00+00:00"}}}}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [live_round], instance=instance, resources=resources, partition_key=DAY.isoformat(), run_config=replay
        )
        assert result.success
        meta = result.asset_materializations_for_node("live_round")[0].metadata
        assert "live-2024-03-10-frequency: submitted" in meta["baselines"].value
        # Without the replay clock the same past round is refused: its deadline has passed.
        refused = dg.materialize(
            [live_round],
            instance=instance,
            resources=resources,
            partition_key=(DAY + timedelta(days=1)).isoformat(),
            raise_on_error=False,
        )
        assert not refused.success
        failure = next(e for e in refused.all_events if e.is_step_failure)
        assert "is not before its deadline 2024-03-12T00:00:00+00:00" in str(
            failure.step_failure_data.user_failure_data
        )
        name = "live-2024-03-10-recurrency"
        instance.add_dynamic_partitions("submissions", [name])
        scored = dg.materialize([submission], instance=instance, resources=resources, partition_key=name)
        meta = scored.asset_materializations_for_node("submission")[0].metadata
        assert meta["status"].value == "accepted" and meta["baseline"].value is True
        assert meta["round"].value == "2024-03-10" and meta["record"].value.endswith(
            f"live/2024-03-10/submissions/{name}/record.json"
        )
        assert "month" not in meta


def test_the_schedule_waits_for_yesterdays_files_until_noon(tmp_path):
    resources = resources_for(make_settings(data_dir=str(tmp_path / "data")))

    defs = dg.Definitions(assets=[live_round], jobs=[live_round_job], schedules=[live_round_daily], resources=resources)

    def tick(at: datetime):
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=at,
            repository_def=defs.get_repository_def(),
            resources={"dataset": resources["dataset"]},
        )
        return live_round_daily.evaluate_tick(context)

    day = date(2024, 3, 10)
    with dg.instance_for_test() as instance:
        early = tick(datetime(2024, 3, 10, 3, tzinfo=UTC))
        assert early.run_requests == [] and early.skip_message.startswith(
            "round 2024-03-10 waits for daily_quads 2024-03-09 and articles 2024-03-09; "
        )
        noon = tick(datetime(2024, 3, 10, 12, tzinfo=UTC))
        assert [(r.run_key, r.partition_key) for r in noon.run_requests] == [("live-2024-03-10", "2024-03-10")]
        write_days(make_settings(data_dir=tmp_path / "data"), [day - timedelta(days=1)], [])
        ready = tick(datetime(2024, 3, 10, 2, tzinfo=UTC))
        assert [r.run_key for r in ready.run_requests] == ["live-2024-03-10"]
    assert live_round_daily.default_status == dg.DefaultScheduleStatus.STOPPED


@pytest.mark.parametrize(("absent", "stored"), [("articles", "daily_quads"), ("daily_quads", "articles")])
def test_the_schedule_names_the_asset_it_waits_for(tmp_path, absent, stored):
    """Both assets store D − 1 as date=<D − 1>.parquet, so the reason names the asset, not the file."""
    data = tmp_path / "data"
    yesterday = date(2024, 3, 9)
    write_days(make_settings(data_dir=data), [yesterday], [])
    layout = DataLayout(data)
    {"articles": layout.articles_path, "daily_quads": layout.daily_quads_path}[absent](yesterday).unlink()
    resources = resources_for(make_settings(data_dir=str(data)))
    defs = dg.Definitions(assets=[live_round], jobs=[live_round_job], schedules=[live_round_daily], resources=resources)
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=datetime(2024, 3, 10, 3, tzinfo=UTC),
            repository_def=defs.get_repository_def(),
            resources={"dataset": resources["dataset"]},
        )
        skip = live_round_daily.evaluate_tick(context)
    assert skip.run_requests == [] and skip.skip_message == (
        f"round 2024-03-10 waits for {absent} 2024-03-09 ({stored} 2024-03-09 is in); "
        "asked again hourly, requested regardless at 12:00 UTC"
    )


def test_the_code_location_has_the_live_round():
    from definitions import defs

    # Inside an instance of its own: loading sets Dagster's current state storage, and a stale one
    # an earlier test's instance left would break it (as in test_leaderboard).
    with dg.instance_for_test():
        repository = defs.get_repository_def()  # validates the whole code location (unique names...)
    assert repository.get_job("live_round_publication") is not None
    assert defs.resolve_schedule_def("live_round_daily").cron_schedule == "0 2-12 * * *"
    assert defs.resolve_assets_def("live_round").group_names_by_key[live_round.key] == "live"


def test_live_rounds_and_submissions_have_lineage_to_what_they_read():
    """The asset graph draws live_round from the daily quads and articles of its window (round D:
    D − MIRAI_LIVE_WINDOW_DAYS .. D − 1, per partition) and submission from the test split and
    live round it is checked against; before, both stood alone in the graph."""
    from assets.articles import articles
    from assets.events import daily_quads
    from assets.partitions import daily_partitions
    from assets.splits import test_split
    from pipeline.config import Settings

    (spec,) = live_round.specs
    deps = {dep.asset_key: dep.partition_mapping for dep in spec.deps}
    assert set(deps) == {daily_quads.key, articles.key}
    window = Settings.from_env().live.window_days
    upstream = deps[daily_quads.key].get_upstream_mapped_partitions_result_for_partitions(
        daily_partitions.subset_with_partition_keys(["2024-03-10"]), daily_partitions, daily_partitions
    )
    days = sorted(upstream.partitions_subset.get_partition_keys())
    assert days == [(date(2024, 3, 10) - timedelta(days=n)).isoformat() for n in range(window, 0, -1)]
    (spec,) = submission.specs
    assert {dep.asset_key for dep in spec.deps} == {test_split.key, live_round.key}
    assert all(isinstance(dep.partition_mapping, dg.AllPartitionMapping) for dep in spec.deps)
