"""One live round through Dagster on a real instance: the sensor requests a resolution run when a
target date closes (and never twice), the `live_resolution` partition resolves and scores it, and
a `live_leaderboard` refresh follows and publishes to the store; a re-run changes nothing."""

from __future__ import annotations

import json
from datetime import date, timedelta

import dagster as dg
import pytest

from assets.live_resolution import live_leaderboard, live_resolution
from assets.resources import resources_for
from pipeline.release.layout import LIVE_LEADERBOARD_KEYS
from pipeline.release.store import LocalStore
from sensors.live_resolution import live_leaderboard_job, live_resolution_job, live_resolution_sensor

from .live_builder import baseline_predictions, history, pairs, world, write_accepted, write_round
from .month_builder import write_days
from .settings_builder import make_settings
from .table_metadata import has_row, table_rows
from .test_markdown import active_markdown

ROUND = date(2024, 3, 10)
T1, T7 = ROUND + timedelta(days=1), ROUND + timedelta(days=7)
WINDOW = [ROUND - timedelta(days=i) for i in range(14, 0, -1)]


@pytest.fixture
def live_data(tmp_path):

    settings = make_settings(data_dir=tmp_path / "data", release_uri=str(tmp_path / "bucket"))
    world_pairs = pairs(seed=31, active=16, quiet=6)
    quads = world(32, world_pairs, [*WINDOW, T1, T7])
    write_days(settings, [*WINDOW, T1], quads)
    write_days(settings, [T7], quads, slot_status="pending")  # T7's day has not settled yet
    questions = write_round(settings, ROUND, world_pairs)
    past = history(settings, WINDOW)
    for method in ("recurrency", "frequency"):
        predictions = baseline_predictions(questions, past, method)
        write_accepted(settings, ROUND, f"live-{ROUND}-{method}", predictions, baseline=True, model=method)
    return settings, quads, baseline_predictions(questions, past, "recurrency")


def tick(instance, defs, resources, cursor):
    with dg.build_sensor_context(
        instance=instance, instance_ref=instance.get_ref(), cursor=cursor, definitions=defs, resources=resources
    ) as context:
        return live_resolution_sensor.evaluate_tick(context)


def test_a_round_is_resolved_scored_and_boarded_through_dagster(live_data):
    settings, quads, _ = live_data
    resources = resources_for(make_settings(data_dir=str(settings.dataset.data_dir), release_uri=settings.release.uri))
    defs = dg.Definitions(
        assets=[live_resolution, live_leaderboard],
        jobs=[live_resolution_job, live_leaderboard_job],
        sensors=[live_resolution_sensor],
        resources=resources,
    )
    sensor_resources = {k: resources[k] for k in ("dataset", "network", "live", "release_store")}
    store = LocalStore(settings.release.uri)
    with dg.instance_for_test() as instance:
        first = tick(instance, defs, sensor_resources, None)
        assert [(r.partition_key, r.run_key) for r in first.run_requests] == [
            (str(ROUND), f"live_resolution:{ROUND}:{T1}")
        ]
        result = dg.materialize([live_resolution], instance=instance, resources=resources, partition_key=str(ROUND))
        meta = result.asset_materializations_for_node("live_resolution")[0].metadata
        assert meta["resolved dates"].value == str(T1) and meta["newly resolved"].value == str(T1)
        assert any(r.startswith("slots not settled") for r in meta["waiting"].value[str(T7)])
        assert meta["questions answered"].value == 22 and 0 < meta["share empty"].value < 1
        assert meta["submissions scored"].value == 2
        scores = json.loads((settings.dataset.data_dir / "live" / str(ROUND) / "scores.json").read_text())
        assert scores["resolved_questions"] == 22
        assert store.get_bytes(f"live/rounds/{ROUND}/answers-{T1}.jsonl") is not None

        # Nothing new to resolve: the next tick asks for the leaderboard, the one after for nothing.
        second = tick(instance, defs, sensor_resources, first.cursor)
        assert [r.job_name for r in second.run_requests] == [live_leaderboard_job.name]
        board = dg.materialize([live_leaderboard], instance=instance, resources=resources)
        assert board.success
        published = json.loads(store.get_bytes(LIVE_LEADERBOARD_KEYS["json"]))
        assert {r["name"] for r in published["cumulative"]} == {"recurrency baseline", "frequency baseline"}
        assert store.get_bytes(LIVE_LEADERBOARD_KEYS["html"]).startswith(b"<!DOCTYPE html>")
        third = tick(instance, defs, sensor_resources, second.cursor)
        assert third.run_requests == [] and "newly closed" in third.skip_message
        # It names the next date to close and the asset partition it waits for.
        assert f"next to close: {T7} of round {ROUND} (slots not settled: " in third.skip_message
        assert f"in gdelt_files {T7}" in third.skip_message

        # T7 settles: one more resolution run, keyed by its date; a re-run of the partition is a no-op.
        write_days(settings, [T7], quads)
        fourth = tick(instance, defs, sensor_resources, third.cursor)
        assert [r.run_key for r in fourth.run_requests] == [f"live_resolution:{ROUND}:{T7}"]
        dg.materialize([live_resolution], instance=instance, resources=resources, partition_key=str(ROUND))
        answers = store.get_bytes(f"live/rounds/{ROUND}/answers-{T7}.jsonl")
        again = dg.materialize([live_resolution], instance=instance, resources=resources, partition_key=str(ROUND))
        meta = again.asset_materializations_for_node("live_resolution")[0].metadata
        assert meta["newly resolved"].value == "none" and meta["resolved dates"].value == f"{T1}, {T7}"
        assert meta["questions answered"].value == 44
        assert store.get_bytes(f"live/rounds/{ROUND}/answers-{T7}.jsonl") == answers
        assert (
            tick(instance, defs, sensor_resources, fourth.cursor).run_requests[0].job_name == live_leaderboard_job.name
        )


def test_an_unpublished_round_fails_its_run_with_the_reason(live_data, tmp_path):
    settings, *_ = live_data
    resources = resources_for(make_settings(data_dir=str(settings.dataset.data_dir), release_uri=settings.release.uri))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [live_resolution], instance=instance, resources=resources, partition_key="2024-03-01", raise_on_error=False
        )
    assert not result.success
    failure = result.failure_data_for_node("live_resolution")
    assert "round 2024-03-01: no published round" in failure.user_failure_data.description


# A submitter's model name that would load a remote image, open links and raw HTML in the operator's
# browser if the Dagster UI rendered it as Markdown.
HOSTILE_MODEL = (
    "![m](http://127.0.0.1:9/p.png) <img src=x onerror=alert(1)> [a](http://127.0.0.1:9/) <http://127.0.0.1:9/>"
)


def test_a_hostile_model_name_is_plain_text_in_every_live_asset_s_metadata(live_data):
    """Issue 30: live_leaderboard's metadata showed a submitter's model name as Markdown, and a name
    like HOSTILE_MODEL made the operator's browser fetch a URL. The scores and the standings are
    tables now, whose cells the UI shows as plain text: the name is there as submitted; any
    Markdown value left, parsed by a CommonMark parser, holds no image, link or HTML."""
    settings, _, predictions = live_data
    write_accepted(settings, ROUND, f"live-{ROUND}-outsider", predictions, model=HOSTILE_MODEL)
    resources = resources_for(make_settings(data_dir=str(settings.dataset.data_dir), release_uri=settings.release.uri))
    with dg.instance_for_test() as instance:
        resolved = dg.materialize([live_resolution], instance=instance, resources=resources, partition_key=str(ROUND))
        boarded = dg.materialize([live_leaderboard], instance=instance, resources=resources)
    metadata = {
        (event.asset_key.to_user_string(), key): value
        for result in (resolved, boarded)
        for event in result.get_asset_materialization_events()
        for key, value in event.materialization.metadata.items()
    }
    for where, value in metadata.items():
        if isinstance(value, dg.MarkdownMetadataValue):
            assert active_markdown(value.value) == [], (where, value.value)
    scores, cumulative = metadata[("live_resolution", "scores")], metadata[("live_leaderboard", "cumulative")]
    assert has_row(scores, submission=f"live-{ROUND}-outsider")
    assert has_row(cumulative, model=HOSTILE_MODEL[:80]), "the hostile name is not shown as it is"
    # The page's mark for rows indistinguishable from the leader (issue 33, point 7): its own column.
    first = table_rows(cumulative)[0]
    assert first["rank"] == 1 and first["overlaps leader"] is False
