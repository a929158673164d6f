"""Live rounds (pipeline/live/rounds.py): the pools and the draw, that the builder reads nothing
after D − 1, reproducibility, publication to a local store and to SeaweedFS (immutable, before
the deadline), the baselines' submissions and live/index.json."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.live import rounds
from pipeline.live.publication import RoundRefused, publish_round, write_live_index
from pipeline.live.rounds import (
    QUESTIONS_SCHEMA,
    RoundNotReady,
    build_round,
    draw_sizes,
    read_window,
    round_seed,
)
from pipeline.reference import country_names
from pipeline.release.layout import UnsafeRelease, check_store_key
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store
from pipeline.storage import DataLayout

from .month_builder import Quad, write_days
from .settings_builder import make_settings

DAY = date(2024, 3, 10)
WINDOW = [DAY - timedelta(days=n) for n in range(7, 0, -1)]  # 03-03 .. 03-09
PUBLISH = datetime(2024, 3, 10, 5, tzinfo=UTC)
ACTIVE = [("USA", "CHN"), ("FRA", "DEU"), ("RUS", "UKR"), ("UKR", "RUS"), ("GBR", "USA"), ("JPN", "KOR")]
QUIET = [("IND", "PAK"), ("BRA", "ARG"), ("EGY", "ISR")]


def window_quads(window: list[date] = WINDOW) -> list[Quad]:
    """The window's quads (WINDOW: the 7 days before DAY, or another window of 7 days)."""
    quads = []
    for i, (s, o) in enumerate(ACTIVE):
        day = window[i % len(window)]
        quads.append(Quad(day, s, "190" if i % 2 else "042", o, 100, kept=5))  # test-grade
        quads.append(Quad(window[-1] if i < 2 else day, s, "036", o, 60, kept=1))  # same pair, database grade
    for i, (s, o) in enumerate(QUIET):
        quads.append(Quad(window[i], s, "010", o, 60, kept=1))  # activity, never test-grade
    quads.append(Quad(window[2], "MEX", "173", "CAN", 100, kept=4))  # 4 articles: quiet, not active
    quads.append(Quad(window[3], "KEN", "057", "ETH", 49, kept=9))  # under the database threshold: nothing
    return quads


def later_quads() -> list[Quad]:
    """Test-grade activity of new pairs on D and after, and before the window: never in the round."""
    return [
        Quad(DAY, "ZAF", "042", "NGA", 500, kept=9),
        Quad(DAY + timedelta(days=1), "AUS", "042", "NZL", 500, kept=9),
        Quad(WINDOW[0] - timedelta(days=1), "CHL", "042", "PER", 500, kept=9),
    ]


def live_settings(data_dir, **overrides) -> Settings:
    values = {
        "data_dir": data_dir,
        "live_window_days": 7,
        "live_round_size": 8,
        "live_quiet_share": 0.25,
        "live_seed": 3,
        "release_uri": "",
    }
    return make_settings(**(values | overrides))


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = live_settings(tmp_path / "data")
    days = [WINDOW[0] - timedelta(days=1), *WINDOW, DAY, DAY + timedelta(days=1)]
    write_days(settings, days, window_quads() + later_quads())
    return settings


def pairs(frame: pl.DataFrame) -> set[tuple[str, str]]:
    return set(frame.select("s", "o").iter_rows())


# --- building ---------------------------------------------------------------------------------


def test_pools_follow_the_split_rules_within_the_window(settings):
    events, activity, read, missing = read_window(DAY, settings.dataset, settings.live)
    assert read == WINDOW and missing == []
    pool = rounds.pools(DAY, events, activity, settings.dataset)
    assert pairs(pool["active"]) == set(ACTIVE)
    assert pairs(pool["quiet"]) == {*QUIET, ("MEX", "CAN")}
    usa = pool["active"].filter(pl.col("s") == "USA").row(0, named=True)
    assert usa["answer_level1"] == ["03", "04"] and usa["s_region"] == "North America"


def test_a_round_asks_each_drawn_pair_once_per_horizon(settings):
    rnd = build_round(DAY, settings.dataset, settings.live)
    q = rnd.questions
    assert q.schema == QUESTIONS_SCHEMA
    assert rnd.drawn == {"active": 3, "quiet": 1} and rnd.pools == {"active": 6, "quiet": 4}
    assert q.height == 8 and q.group_by("s", "o").len().get_column("len").to_list() == [2] * 4
    assert sorted(set(q.get_column("date").to_list())) == [DAY + timedelta(days=1), DAY + timedelta(days=7)]
    assert q.get_column("query_id").to_list() == [f"2024-03-10-{n:04d}" for n in range(1, 9)]
    assert q.sort("date", "s", "o").equals(q)
    first = q.row(0, named=True)
    assert first["query_code"] == f"(2024-03-11, {first['s']}, ?, {first['o']})" and first["horizon"] == 1
    assert pairs(q.filter(pl.col("stratum") == "quiet")) <= {*QUIET, ("MEX", "CAN")}
    assert pairs(q.filter(pl.col("stratum") == "active")) <= set(ACTIVE)
    published = [json.loads(line) for line in rnd.jsonl().splitlines()]
    assert list(published[0]) == [
        "query_id",
        "round",
        "horizon",
        "date",
        "s",
        "o",
        "s_name",
        "o_name",
        "s_region",
        "o_region",
        "query_code",
    ]
    assert published[0]["date"] == "2024-03-11" and "stratum" not in published[0]


def test_the_builder_reads_nothing_after_d_minus_1(settings):
    before = build_round(DAY, settings.dataset, settings.live).jsonl()
    layout = DataLayout(settings.dataset.data_dir)
    outside = [DAY + timedelta(days=n) for n in range(9)] + [WINDOW[0] - timedelta(days=n) for n in range(1, 4)]
    for day in outside:
        for path in (layout.daily_quads_path(day), layout.articles_path(day), layout.slot_ledger_path(day)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"garbage, not parquet")
    assert build_round(DAY, settings.dataset, settings.live).jsonl() == before
    # The same garbage inside the window stops the build: the files above would have been noticed.
    layout.articles_path(WINDOW[-1]).write_bytes(b"garbage, not parquet")
    with pytest.raises(Exception, match=r"parquet|magic|Parquet"):
        build_round(DAY, settings.dataset, settings.live)


def test_same_inputs_same_bytes_and_each_day_its_own_seed(settings):
    assert (
        build_round(DAY, settings.dataset, settings.live).jsonl()
        == build_round(DAY, settings.dataset, settings.live).jsonl()
    )
    assert round_seed(3, DAY) == round_seed(3, DAY) != round_seed(3, DAY + timedelta(days=1))
    assert round_seed(3, DAY) != round_seed(4, DAY)
    assert build_round(DAY, settings.dataset, settings.live).seed == round_seed(3, DAY)


def test_the_seed_moves_the_draw_of_a_pool_larger_than_the_samplers_candidates(tmp_path):
    # The greedy sampler looks at 50 random candidates a step: a pool above that is drawn by the seed.
    codes = sorted(country_names().get_column("iso3").to_list())[:81]
    quads = [Quad(WINDOW[i % 7], s, "042", o, 100, kept=5) for i, (s, o) in enumerate(pairwise(codes))]
    settings = live_settings(tmp_path / "data", live_round_size=40)
    write_days(settings, [*WINDOW, DAY + timedelta(days=1)], quads)
    draws = {
        tuple(sorted(pairs(build_round(day, settings.dataset, settings.live).questions)))
        for day in (DAY, DAY + timedelta(days=1))
    }
    assert len(draws) == 2 and all(len(d) == 20 for d in draws)


def test_a_short_pool_gives_its_places_to_the_other():
    assert draw_sizes(50, 0.25, {"active": 100, "quiet": 100}) == {"active": 38, "quiet": 12}
    assert draw_sizes(50, 0.25, {"active": 100, "quiet": 3}) == {"active": 47, "quiet": 3}
    assert draw_sizes(50, 0.25, {"active": 10, "quiet": 100}) == {"active": 10, "quiet": 40}
    assert draw_sizes(50, 0.25, {"active": 10, "quiet": 5}) == {"active": 10, "quiet": 5}


def test_a_window_with_no_files_is_not_ready(tmp_path):
    with pytest.raises(RoundNotReady, match=r"no day of its window 2024-03-03 \.\. 2024-03-09"):
        empty = live_settings(tmp_path / "empty")
        build_round(DAY, empty.dataset, empty.live)


# --- publication ------------------------------------------------------------------------------


def test_store_keys_of_live_rounds_are_checked():
    for key in (
        "live/index.json",
        "live/rounds/2024-03-10/questions.jsonl",
        "live/rounds/2024-03-10/manifest.json",
        "live/rounds/2024-03-10/answers-2024-03-11.jsonl",
    ):
        assert check_store_key(key) == key
    for key in (
        "live/rounds/2024-02-30/questions.jsonl",
        "live/rounds/2024-03-10/../../x",
        "live/rounds/2024-03-10/answers-2024-13-01.jsonl",
        "live/rounds/2024-03-10/other.json",
        "live/other.json",
    ):
        with pytest.raises(UnsafeRelease):
            check_store_key(key)


def test_publication_writes_the_round_once_with_its_manifest_and_index(settings, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    result = publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    assert result.published_now and result.questions == 8
    base = store.root / "live" / "rounds" / "2024-03-10"
    questions, manifest_raw = (base / "questions.jsonl").read_bytes(), (base / "manifest.json").read_bytes()
    manifest = json.loads(manifest_raw)
    assert manifest["files"]["questions.jsonl"] == {
        "sha256": hashlib.sha256(questions).hexdigest(),
        "bytes": len(questions),
        "rows": 8,
    }
    assert manifest["format"] == "mirai-live-round-v1" and manifest["history_cutoff"] == "2024-03-09"
    assert (
        manifest["deadline"] == "2024-03-11T00:00:00+00:00" and manifest["published_at"] == "2024-03-10T05:00:00+00:00"
    )
    assert manifest["target_dates"] == ["2024-03-11", "2024-03-17"] and manifest["horizons"] == [1, 7]
    assert manifest["sampler"]["seed"] == round_seed(3, DAY) and manifest["sampler"]["pools"] == {
        "active": 6,
        "quiet": 4,
    }
    local = settings.dataset.data_dir / "live" / "2024-03-10"
    assert (local / "manifest.json").read_bytes() == manifest_raw
    assert pl.read_parquet(local / "questions.parquet").get_column("stratum").to_list().count("quiet") == 2
    index = json.loads((store.root / "live" / "index.json").read_bytes())
    assert index["rounds"] == [
        {
            "round": "2024-03-10",
            "manifest": "live/rounds/2024-03-10/manifest.json",
            "manifest_sha256": hashlib.sha256(manifest_raw).hexdigest(),
            "questions": "live/rounds/2024-03-10/questions.jsonl",
            "deadline": "2024-03-11T00:00:00+00:00",
            "target_dates": ["2024-03-11", "2024-03-17"],
            "resolved_dates": [],
        }
    ]
    # A re-run (even after the deadline) builds the same round: nothing changes.
    again = publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH + timedelta(days=3))
    assert not again.published_now and not again.index_written
    assert (base / "manifest.json").read_bytes() == manifest_raw
    # A different round for the same day is refused, and nothing is overwritten.
    with pytest.raises(ReleaseConflict, match="never rewritten"):
        other = live_settings(settings.dataset.data_dir, live_seed=4)
        publish_round(DAY, other.dataset, other.gdelt, other.live, store, now=PUBLISH)
    assert (base / "questions.jsonl").read_bytes() == questions
    # Answers published by resolution show up in the index, newest round first.
    (base / "answers-2024-03-11.jsonl").write_bytes(b"")
    assert write_live_index(store)
    assert json.loads((store.root / "live" / "index.json").read_bytes())["rounds"][0]["resolved_dates"] == [
        "2024-03-11"
    ]


def test_publication_precedes_the_deadline(settings, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    for late in (datetime(2024, 3, 11, tzinfo=UTC), datetime(2024, 3, 12, 9, tzinfo=UTC)):
        with pytest.raises(RoundRefused, match="not before its deadline 2024-03-11T00:00:00"):
            publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=late)
    with pytest.raises(RoundRefused, match="history runs through 2024-03-09"):
        publish_round(
            DAY, settings.dataset, settings.gdelt, settings.live, store, now=datetime(2024, 3, 9, 23, 59, tzinfo=UTC)
        )
    assert store.list_keys("live/", max_keys=10).keys == []
    assert publish_round(
        DAY, settings.dataset, settings.gdelt, settings.live, store, now=datetime(2024, 3, 10, 23, 59, 59, tzinfo=UTC)
    ).published_now


def test_baselines_are_submitted_at_publication_from_the_window_only(settings, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    result = publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    assert result.baselines == {"live-2024-03-10-recurrency": "submitted", "live-2024-03-10-frequency": "submitted"}
    questions = pl.read_parquet(settings.dataset.data_dir / "live" / "2024-03-10" / "questions.parquet")
    for method in ("recurrency", "frequency"):
        directory = store.root / "submissions" / f"live-2024-03-10-{method}"
        meta = json.loads((directory / "submission.json").read_bytes())
        assert meta == {
            "model": f"{method} baseline",
            "knowledge_cutoff": "2024-03-09",
            "contact": "mirai-pipeline (model-free baseline, submitted at publication)",
            "round": "2024-03-10",
        }
        records = [json.loads(line) for line in (directory / "predictions.jsonl").read_bytes().splitlines()]
        assert [r["query_id"] for r in records] == questions.get_column("query_id").to_list()
        for record, (s, o) in zip(records, questions.select("s", "o").iter_rows()):
            assert 0 <= record["p_event"] <= 1
            if (s, o) == ("USA", "CHN"):  # events on 03-03 (042) and 03-09 (036)
                assert record["p_event"] == (2 / 7 if method == "frequency" else 1.0)
                # recurrency: every relation, the latest first; frequency: the top k (1 here)
                assert record["ranked"] == (["036", "042"] if method == "recurrency" else ["036"])
            if (s, o) == ("MEX", "CAN"):  # 4 articles: not even a database event
                assert record["p_event"] == 0.0 and record["ranked"] == []
    recorded = json.loads((settings.dataset.data_dir / "live" / "2024-03-10" / "baselines.json").read_bytes())
    assert set(recorded) == set(result.baselines)
    # A re-run uploads nothing new; a squatted name is reported, not overwritten.
    assert (
        publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH).baselines
        == result.baselines
    )


def test_a_squatted_baseline_name_is_reported(settings, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    squatted = store.root / "submissions" / "live-2024-03-10-frequency"
    squatted.mkdir(parents=True)
    (squatted / "predictions.jsonl").write_bytes(b"{}\n")
    result = publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    assert "holds other bytes" in result.baselines["live-2024-03-10-frequency"]
    assert result.baselines["live-2024-03-10-recurrency"] == "submitted"
    assert (squatted / "predictions.jsonl").read_bytes() == b"{}\n"


def test_a_hostile_manifest_stops_the_index(settings, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    publish_round(DAY, settings.dataset, settings.gdelt, settings.live, store, now=PUBLISH)
    other = store.root / "live" / "rounds" / "2024-03-11"
    other.mkdir()
    (other / "manifest.json").write_bytes(json.dumps({"format": "mirai-live-round-v1", "round": "2024-03-12"}).encode())
    with pytest.raises(UnsafeRelease, match="not the mirai-live-round-v1 manifest of round 2024-03-11"):
        write_live_index(store)


@pytest.fixture
def s3_settings(settings, s3_server, bucket) -> Settings:
    return live_settings(
        settings.dataset.data_dir,
        release_uri=f"s3://{bucket}/mirai",
        s3_endpoint_url=s3_server.endpoint,
        s3_region="us-east-1",
    )


def test_publication_on_seaweedfs(s3_settings):
    store = open_store(s3_settings.dataset, s3_settings.network, s3_settings.release)
    result = publish_round(DAY, s3_settings.dataset, s3_settings.gdelt, s3_settings.live, store, now=PUBLISH)
    assert result.published_now and result.index_written
    raw = store.get_bytes("live/rounds/2024-03-10/manifest.json")
    assert raw == (s3_settings.dataset.data_dir / "live" / "2024-03-10" / "manifest.json").read_bytes()
    questions = store.get_bytes("live/rounds/2024-03-10/questions.jsonl")
    assert json.loads(raw)["files"]["questions.jsonl"]["sha256"] == hashlib.sha256(questions).hexdigest()
    assert [r["round"] for r in json.loads(store.get_bytes("live/index.json"))["rounds"]] == ["2024-03-10"]
    assert not publish_round(
        DAY, s3_settings.dataset, s3_settings.gdelt, s3_settings.live, store, now=PUBLISH
    ).published_now
    with pytest.raises(ReleaseConflict):
        other = make_settings(s3_settings, live_seed=9)
        publish_round(DAY, other.dataset, other.gdelt, other.live, store, now=PUBLISH)
    assert store.get_bytes("live/rounds/2024-03-10/manifest.json") == raw
