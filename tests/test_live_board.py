"""The live leaderboard (pipeline/live/board.py): per round and cumulative over two resolved
rounds, one row per model identity across rounds, baselines included and ranked above every
degenerate strategy, hostile names escaped, the same bytes for the same inputs, published to
live/ in a local store and on SeaweedFS only when changed."""

from __future__ import annotations

import html
import json
from datetime import date, timedelta

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.live.board import build_leaderboard, publish_live_leaderboard, write_live_leaderboard
from pipeline.live.resolve import resolve_round
from pipeline.release import LocalStore, open_store
from pipeline.release_layout import LIVE_LEADERBOARD_KEYS

from .live_builder import baseline_predictions, history, midnight, pairs, write_accepted, write_round, write_world

ROUNDS = [date(2024, 3, 10), date(2024, 3, 11)]
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def frame(ids: list[str], relations: list[str], p: float | None) -> pl.DataFrame:
    return pl.DataFrame(
        {"query_id": ids, "relations": [relations] * len(ids), "p_event": [p] * len(ids)},
        schema={"query_id": pl.String, "relations": pl.List(pl.String), "p_event": pl.Float64},
    )


@pytest.fixture(scope="module")
def board_data(tmp_path_factory) -> Settings:
    settings = Settings(data_dir=tmp_path_factory.mktemp("board") / "data")
    world_pairs = pairs(seed=21, active=24, quiet=8)
    days = [ROUNDS[0] - timedelta(days=i) for i in range(21, -9, -1)]
    write_world(settings, 22, world_pairs, days)
    for round_day in ROUNDS:
        questions = write_round(settings, round_day, world_pairs)
        past = history(settings, [d for d in days if d < round_day][-21:])
        for method in ("recurrency", "frequency"):
            predictions = baseline_predictions(questions, past, method)
            write_accepted(settings, round_day, f"live-{round_day}-{method}", predictions, baseline=True, model=method)
        ids = questions.get_column("query_id").to_list()
        write_accepted(settings, round_day, f"empty-{round_day}", frame(ids, [], None), model="always empty")
        write_accepted(settings, round_day, f"p1-{round_day}", frame(ids, [], 1.0), model="p_event 1")
        write_accepted(settings, round_day, f"x-{round_day}", frame(ids, ["042"], 0.7), model=HOSTILE, contact="a@b")
        resolve_round(round_day, settings, now=midnight(round_day) + timedelta(days=9))
    # A second file from the same model and contact in round 2, sent later: it replaces the first.
    later = frame(ids, ["042", "043"], 0.7)
    write_accepted(settings, ROUNDS[1], "x-again", later, model=f"  {HOSTILE} ", contact="a@b")
    record_path = settings.data_dir / "live" / str(ROUNDS[1]) / "submissions" / "x-again" / "record.json"
    record = json.loads(record_path.read_text())
    record["submitted_at"] = (midnight(ROUNDS[1] + timedelta(days=1)) - timedelta(minutes=5)).isoformat()
    record_path.write_text(json.dumps(record))
    return settings


def test_rounds_and_the_cumulative_board_rank_baselines_above_degenerate_strategies(board_data):
    board = build_leaderboard(board_data)
    assert [r["round"] for r in board["rounds"]] == ["2024-03-11", "2024-03-10"]
    cumulative = {r["name"]: r for r in board["cumulative"]}
    assert set(cumulative) == {"recurrency baseline", "frequency baseline", "always empty", "p_event 1", HOSTILE}
    for name in ("recurrency baseline", "frequency baseline", HOSTILE):
        assert cumulative[name]["rounds"] == ["2024-03-10", "2024-03-11"]
    # Every round's resolved questions, 2 rounds × 32 pairs × 2 dates.
    assert cumulative["frequency baseline"]["questions"] == 128
    assert cumulative[HOSTILE]["submissions"] == ["x-2024-03-10", "x-again"]
    for rows in [board["cumulative"]] + [r["rows"] for r in board["rounds"]]:
        ranks = {r["name"]: r["rank"] for r in rows}
        worst_baseline = max(ranks["recurrency baseline"], ranks["frequency baseline"])
        assert ranks["always empty"] > worst_baseline and ranks["p_event 1"] > worst_baseline
        assert [r["rank"] for r in rows] == sorted(r["rank"] for r in rows)
        low, high = rows[0]["live_score_ci95"]
        assert low <= rows[0]["live_score"] <= high
    assert "contact" not in json.dumps(board) and "a@b" not in json.dumps(board)


def test_the_page_escapes_hostile_names_and_is_the_same_bytes_for_the_same_inputs(board_data):
    first = write_live_leaderboard(board_data)
    page = first.html_path.read_bytes()
    assert b"<script>" not in page and b"<img" not in page
    assert html.escape(HOSTILE).encode() in page
    assert json.loads(first.json_path.read_text())["cumulative"] == first.board["cumulative"]
    again = write_live_leaderboard(board_data)
    assert again.html_path.read_bytes() == page and again.json_path.read_bytes() == first.json_path.read_bytes()


def test_published_to_live_once_per_change_locally_and_on_seaweedfs(board_data, tmp_path, s3_server, bucket):
    written = write_live_leaderboard(board_data)
    store = LocalStore(tmp_path / "bucket")
    assert publish_live_leaderboard(store, written) == list(LIVE_LEADERBOARD_KEYS.values())
    assert store.get_bytes(LIVE_LEADERBOARD_KEYS["html"]) == written.html_path.read_bytes()
    assert publish_live_leaderboard(store, written) == []
    remote = board_data.with_(release_uri=f"s3://{bucket}/m", s3_endpoint_url=s3_server.endpoint, s3_region="us-east-1")
    assert len(publish_live_leaderboard(open_store(remote), written)) == 2
    head = s3_server.client().head_object(Bucket=bucket, Key=f"m/{LIVE_LEADERBOARD_KEYS['html']}")
    assert head["ContentType"] == "text/html; charset=utf-8" and head["CacheControl"] == "no-cache"
    assert publish_live_leaderboard(open_store(remote), written) == []
