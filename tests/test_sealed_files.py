"""Sealed derived files (events, daily quads, unmapped codes, articles): their sha256 is recorded
under digests/ before they are written, so damage that still decodes is found by the blocking
checks and refused by every reader, and re-materialising the day rebuilds the file."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from pipeline.storage import DamagedFile, DataLayout, seal_problem, verified, write_sealed_parquet
from quality.event_checks import daily_quads_valid, events_valid

from .conftest import MIRROR_DAY
from .dagster_day import PARTITION, materialised_day, run_check_alone


def _a_frame() -> pl.DataFrame:
    return pl.DataFrame({"s": ["FRA", "USA", "CHN"], "r": ["036", "042", "190"], "n": [3, 1, 7]})


def test_a_sealed_file_matches_its_digest_and_other_bytes_do_not(tmp_path):
    layout = DataLayout(tmp_path)
    path = tmp_path / "events" / "date=2024-01-01.parquet"
    write_sealed_parquet(layout, _a_frame(), path, metadata={"day": "2024-01-01"})
    assert layout.digest_path(path) == tmp_path / "digests/events/date=2024-01-01.parquet.sha256"
    assert seal_problem(layout, path) is None and verified(layout, path) == [path]

    # Damage that decodes: a valid parquet file with one value changed (a bad restore, a bit flip
    # in a value) reads without error, so only the digest tells.
    pl.DataFrame({"s": ["FRA", "USA", "CHN"], "r": ["036", "042", "190"], "n": [3, 1, 8]}).write_parquet(path)
    assert pl.read_parquet(path)["n"].to_list() == [3, 1, 8]
    problem = seal_problem(layout, path)
    assert problem is not None and "; written as sha256 " in problem
    with pytest.raises(
        DamagedFile, match=r"1 stored file\(s\) changed after they were written.*events/date=2024-01-01\.parquet"
    ):
        verified(layout, tmp_path / "other.parquet", path)

    path.unlink()
    assert seal_problem(layout, path).startswith("missing (its digest records sha256 ")


def test_a_file_written_before_digests_is_taken_as_it_is(tmp_path):
    layout = DataLayout(tmp_path)
    path = tmp_path / "daily_quads" / "date=2024-01-01.parquet"
    path.parent.mkdir(parents=True)
    _a_frame().write_parquet(path)
    assert seal_problem(layout, path) is None and verified(layout, path) == [path]


def test_rewriting_a_sealed_file_gives_the_same_bytes_and_digest(tmp_path):
    layout = DataLayout(tmp_path)
    path = tmp_path / "events" / "date=2024-01-01.parquet"
    write_sealed_parquet(layout, _a_frame(), path)
    first = (path.read_bytes(), layout.digest_path(path).read_bytes())
    write_sealed_parquet(layout, _a_frame(), path)
    assert (path.read_bytes(), layout.digest_path(path).read_bytes()) == first


@pytest.fixture
def materialised(tmp_path, mirror):
    with materialised_day(
        tmp_path,
        mirror,
        [gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads, events_valid, daily_quads_valid],
    ) as (layout, resources, instance, _):
        yield layout, resources, instance


def _check_alone(check, asset, resources, instance) -> dg.AssetCheckEvaluation:
    [evaluation] = run_check_alone(check, asset, resources, instance).get_asset_check_evaluations()
    return evaluation


def test_damaged_events_fail_their_check_stop_the_quads_and_are_rebuilt(materialised):
    layout, resources, instance = materialised
    events_path, quads_path = layout.events_path(MIRROR_DAY), layout.daily_quads_path(MIRROR_DAY)
    good_events, good_quads = events_path.read_bytes(), quads_path.read_bytes()
    assert seal_problem(layout, events_path) is None and seal_problem(layout, quads_path) is None

    # Damage that decodes: one event's target country changed, the file otherwise intact.
    frame = pl.read_parquet(events_path)
    frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("ATA")).otherwise(pl.col("o")).alias("o")
    ).write_parquet(events_path)

    check = _check_alone(events_valid, events, resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "events file changed after it was written" in check.description
    assert "written as sha256" in check.metadata["damage"].value

    # A reader refuses it: the quads are not built from damaged events.
    failed = dg.materialize(
        [daily_quads],
        partition_key=PARTITION,
        resources=resources,
        instance=instance,
        selection=[daily_quads],
        raise_on_error=False,
    )
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert "changed after they were written" in str(failure.step_failure_data.error)
    assert quads_path.read_bytes() == good_quads

    # Materialising the day again rebuilds the events byte for byte; the check passes again.
    rebuilt = dg.materialize(
        [events, daily_quads, events_valid, daily_quads_valid],
        partition_key=PARTITION,
        resources=resources,
        instance=instance,
    )
    assert rebuilt.success and all(e.passed for e in rebuilt.get_asset_check_evaluations())
    assert events_path.read_bytes() == good_events and quads_path.read_bytes() == good_quads


def test_damaged_quads_fail_their_check(materialised):
    layout, resources, instance = materialised
    quads_path = layout.daily_quads_path(MIRROR_DAY)
    data = bytearray(quads_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    quads_path.write_bytes(bytes(data))
    check = _check_alone(daily_quads_valid, daily_quads, resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "daily_quads file changed after it was written" in check.description
