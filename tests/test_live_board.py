"""The live leaderboard (pipeline/live/board.py): per round and cumulative over two resolved
rounds, one row per model identity across rounds, baselines included and ranked above every
degenerate strategy, hostile names escaped, the same bytes for the same inputs, published to
live/ in a local store and on SeaweedFS only when changed."""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import unicodedata
from datetime import date, timedelta

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.live.board import build_leaderboard, page, publish_live_leaderboard, write_live_leaderboard
from pipeline.live.resolve import resolve_round
from pipeline.release.layout import LIVE_LEADERBOARD_KEYS
from pipeline.release.store import LocalStore
from pipeline.release.store_uri import open_store

from .chromium import headless_chromium, needs_chromium
from .live_builder import baseline_predictions, history, midnight, pairs, write_accepted, write_round, write_world
from .settings_builder import make_settings

ROUNDS = [date(2024, 3, 10), date(2024, 3, 11)]
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


# Each model's submitter's owner key (submission.json's owner_key): the same in every round.
KEYS = ("owner-key-of-always-empty", "owner-key-of-p-event-one", "owner-key-of-the-hostile-name")


def frame(ids: list[str], relations: list[str], p: float | None) -> pl.DataFrame:
    return pl.DataFrame(
        {"query_id": ids, "relations": [relations] * len(ids), "p_event": [p] * len(ids)},
        schema={"query_id": pl.String, "relations": pl.List(pl.String), "p_event": pl.Float64},
    )


@pytest.fixture(scope="module")
def board_data(tmp_path_factory) -> Settings:
    settings = make_settings(data_dir=tmp_path_factory.mktemp("board") / "data")
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
        write_accepted(
            settings, round_day, f"empty-{round_day}", frame(ids, [], None), model="always empty", owner_key=KEYS[0]
        )
        write_accepted(
            settings, round_day, f"p1-{round_day}", frame(ids, [], 1.0), model="p_event 1", owner_key=KEYS[1]
        )
        write_accepted(
            settings,
            round_day,
            f"x-{round_day}",
            frame(ids, ["042"], 0.7),
            model=HOSTILE,
            contact="a@b",
            owner_key=KEYS[2],
        )
        resolve_round(round_day, settings.dataset, settings.live, now=midnight(round_day) + timedelta(days=9))
    # A second file from the same model and contact in round 2, sent later: it replaces the first.
    later = frame(ids, ["042", "043"], 0.7)
    write_accepted(settings, ROUNDS[1], "x-again", later, model=f"  {HOSTILE} ", contact="a@b", owner_key=KEYS[2])
    record_path = settings.dataset.data_dir / "live" / str(ROUNDS[1]) / "submissions" / "x-again" / "record.json"
    record = json.loads(record_path.read_text())
    record["submitted_at"] = (midnight(ROUNDS[1] + timedelta(days=1)) - timedelta(minutes=5)).isoformat()
    record_path.write_text(json.dumps(record))
    return settings


def test_rounds_and_the_cumulative_board_rank_baselines_above_degenerate_strategies(board_data):
    board = build_leaderboard(board_data.dataset)
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
    first = write_live_leaderboard(board_data.dataset)
    page = first.html_path.read_bytes()
    assert b"<script>" not in page and b"<img" not in page
    assert html.escape(HOSTILE).encode() in page
    assert json.loads(first.json_path.read_text())["cumulative"] == first.board["cumulative"]
    again = write_live_leaderboard(board_data.dataset)
    assert again.html_path.read_bytes() == page and again.json_path.read_bytes() == first.json_path.read_bytes()


def test_bidi_controls_and_invisible_characters_in_model_names_are_shown_on_the_page(board_data):
    """Trojan Source (CVE-2021-42574): a model named "gpt" RLO "evil" was displayed as "gptlive",
    one named "always" ZWSP "empty" as a baseline's look-alike. Shown as <U+XXXX>; other scripts
    and emoji as they are."""
    names = {HOSTILE: "gpt\u202eevil", "always empty": "always\u200bempty", "p_event 1": "模型 نموذج 👩🏽\u200d💻"}
    board = build_leaderboard(board_data.dataset)
    board["cumulative"] = [r | {"name": names.get(r["name"], r["name"])} for r in board["cumulative"]]
    text = page(board).decode()
    assert "<td>gpt&lt;U+202E&gt;evil</td>" in text and "<td>always&lt;U+200B&gt;empty</td>" in text
    assert "<td>模型 نموذج 👩🏽\u200d💻</td>" in text
    assert {c for c in text if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\u200d"} == set()


def test_published_to_live_once_per_change_locally_and_on_seaweedfs(board_data, tmp_path, s3_server, bucket):
    written = write_live_leaderboard(board_data.dataset)
    store = LocalStore(tmp_path / "bucket")
    assert publish_live_leaderboard(store, written) == list(LIVE_LEADERBOARD_KEYS.values())
    assert store.get_bytes(LIVE_LEADERBOARD_KEYS["html"]) == written.html_path.read_bytes()
    assert publish_live_leaderboard(store, written) == []
    remote = make_settings(
        board_data, release_uri=f"s3://{bucket}/m", s3_endpoint_url=s3_server.endpoint, s3_region="us-east-1"
    )
    assert len(publish_live_leaderboard(open_store(remote.dataset, remote.network, remote.release), written)) == 2
    head = s3_server.client().head_object(Bucket=bucket, Key=f"m/{LIVE_LEADERBOARD_KEYS['html']}")
    assert head["ContentType"] == "text/html; charset=utf-8" and head["CacheControl"] == "no-cache"
    assert publish_live_leaderboard(open_store(remote.dataset, remote.network, remote.release), written) == []


def test_a_stranger_declaring_someone_s_model_and_contact_cannot_take_their_row(board_data, tmp_path):
    """Issue 30: the id was sha256(model, contact)[:12], so 32 guesses found a contact from the
    public board, and a stranger's later on-time submission declaring that (model, contact)
    replaced the victim's entry. Now the id is an HMAC under the data directory's secret, and a
    submission counts for a row only with that row's owner key: without it, or with another, the
    stranger gets a row of their own and the victim's keeps its scores."""
    settings = make_settings(data_dir=tmp_path / "data")
    shutil.copytree(board_data.dataset.data_dir, settings.dataset.data_dir)
    before = {r["id"]: r for r in build_leaderboard(settings.dataset)["cumulative"]}
    [victim] = [r for r in before.values() if r["name"] == HOSTILE]
    ids = pl.read_parquet(settings.dataset.data_dir / "live" / str(ROUNDS[1]) / "questions.parquet").get_column(
        "query_id"
    )
    for name, key in (("thief-no-key", None), ("thief-own-key", "a-key-of-the-thief-own")):
        write_accepted(
            settings, ROUNDS[1], name, frame(ids.to_list(), ["190"], 0.1), model=HOSTILE, contact="a@b", owner_key=key
        )
        path = settings.dataset.data_dir / "live" / str(ROUNDS[1]) / "submissions" / name / "record.json"
        record = json.loads(path.read_text())
        record["submitted_at"] = (midnight(ROUNDS[1] + timedelta(days=1)) - timedelta(minutes=1)).isoformat()
        path.write_text(json.dumps(record))  # later than the victim's last file, still on time
    after = {r["id"]: r for r in build_leaderboard(settings.dataset)["cumulative"]}
    assert after[victim["id"]] == victim  # same id, same submissions, same scores
    thieves = [r for r in after.values() if r["name"] == HOSTILE and r["id"] != victim["id"]]
    assert sorted(r["submissions"] for r in thieves) == [["thief-no-key"], ["thief-own-key"]]
    # Neither the contact nor a plain hash of the declared identity appears on the board.
    published = json.dumps(build_leaderboard(settings.dataset))
    naive = hashlib.sha256(("model:" + json.dumps([HOSTILE, "a@b"])).encode()).hexdigest()[:12]
    assert "a@b" not in published and naive not in published and victim["id"] != naive


def test_row_ids_are_hmacs_under_a_private_key_made_once(board_data, tmp_path):
    settings = make_settings(data_dir=tmp_path / "data")
    shutil.copytree(board_data.dataset.data_dir, settings.dataset.data_dir)
    (settings.dataset.data_dir / "live" / "board-id.key").unlink(missing_ok=True)
    first = build_leaderboard(settings.dataset)
    key_file = settings.dataset.data_dir / "live" / "board-id.key"
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32
    assert build_leaderboard(settings.dataset) == first  # the same key: the same ids
    key_file.unlink()
    other = build_leaderboard(settings.dataset)  # a new key: every id changes, nothing else
    assert {r["id"] for r in other["cumulative"]}.isdisjoint(r["id"] for r in first["cumulative"])
    strip = lambda board: [{k: v for k, v in r.items() if k != "id"} for r in board["cumulative"]]  # noqa: E731
    assert strip(other) == strip(first)


def test_rows_rank_by_the_live_score_and_the_mark_follows_the_leaders_interval(board_data):
    """Issue 33: as on the monthly board, overlapping intervals set the rank (every row near the
    leader ranked 1). Now the rank is the point estimate's and ≈ leader is the overlap."""
    board = build_leaderboard(board_data.dataset)
    below = 0
    for rows in [board["cumulative"]] + [r["rows"] for r in board["rounds"]]:
        keys = [(r["live_score"], r["level2_f1"] or 0.0, r["occurrence_accuracy"]) for r in rows]
        assert [r["rank"] for r in rows] == [1 + sum(k > key for k in keys) for key in keys]
        leader_low, leader_high = rows[0]["live_score_ci95"]
        for row in rows:
            low, high = row["live_score_ci95"]
            assert row["overlaps_leader"] is (low <= leader_high and high >= leader_low)
            below += row["overlaps_leader"] and row["rank"] > 1
    assert below >= 1  # a row the old tiers tied with the leader, now ranked below it and marked
    assert len({r["rank"] for r in board["cumulative"]}) == len(board["cumulative"])


def test_the_cumulative_chart_shows_each_models_score_after_each_round_with_its_interval(board_data):
    from pipeline.live.board import round_series

    board = build_leaderboard(board_data.dataset)
    first_round = {r["name"]: r for r in next(e for e in board["rounds"] if e["round"] == str(ROUNDS[0]))["rows"]}
    for row in board["cumulative"]:
        history = row["by_round"]
        assert [h["round"] for h in history] == row["rounds"]
        # After its first round, a model's cumulative score is that round's; after its last, the row's.
        assert history[0]["live_score"] == first_round[row["name"]]["live_score"]
        assert history[0]["live_score_ci95"] == first_round[row["name"]]["live_score_ci95"]
        assert (history[-1]["live_score"], history[-1]["live_score_ci95"]) == (
            row["live_score"],
            row["live_score_ci95"],
        )
        assert history[-1]["questions"] == row["questions"] > history[0]["questions"]
    series, days = round_series(board)
    assert days == [str(d) for d in ROUNDS]
    assert [s.name for s in series] == [r["name"] for r in board["cumulative"]]  # in rank order
    assert {s.name for s in series if s.dashed} == {"recurrency baseline", "frequency baseline"}
    assert all([p.x for p in s.points] == [0, 1] for s in series)
    text = page(board).decode()
    chart = re.search(r'<figure class="rounds">(.*?)</figure>', text, re.S).group(1)
    assert chart.count('<g id="LineCollection_') == sum(len(s.points) for s in series)  # an error bar each
    assert re.findall(r'<g id="(legend_\d+)">', chart) == ["legend_1", "legend_2"]  # names, and the styles
    assert "<script" not in chart and html.escape(HOSTILE) not in chart  # names drawn as paths, not text


def test_the_live_page_has_a_key_to_its_chart_and_row_styles(board_data):
    text = page(build_leaderboard(board_data.dataset)).decode()
    key = re.search(r'<h2 id="key">Key</h2>\s*<ul class="legend">(.*?)</ul>', text, re.S).group(1)
    for said in (
        "a solid line a submitted model, a dashed one a baseline; error bars are 95% intervals",
        "<b>leader</b> marks the rank-1 rows; <b>≈</b> a row whose interval overlaps the leader's",
        '<span class="sample-baseline">grey italic row</span> is a baseline',
    ):
        assert said in key, said
    assert set(re.findall(r'<tr class="([^"]+)">', text)) == {"baseline", "submission"}
    assert "tr.baseline td { color: #555; font-style: italic; }" in text


@needs_chromium
def test_the_live_page_renders_its_chart_and_tables_in_headless_chromium_without_a_request(board_data, tmp_path):
    from selenium.webdriver.common.by import By

    written = write_live_leaderboard(board_data.dataset)
    with headless_chromium(tmp_path) as driver:
        driver.get(written.html_path.as_uri())
        assert driver.title == "MIRAI live leaderboard"
        chart = driver.find_element(By.CSS_SELECTOR, "section#cumulative figure.rounds svg")
        assert chart.size["width"] > 300 and chart.size["height"] > 150
        box = driver.execute_script("return arguments[0].getBBox()", chart)
        assert box["width"] > 300 and box["height"] > 150
        rows = driver.find_elements(By.CSS_SELECTOR, "section#cumulative tbody tr")
        assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == [str(i) for i in range(1, len(rows) + 1)]
        assert HOSTILE in driver.find_element(By.TAG_NAME, "body").text  # shown as text
        assert driver.execute_script("return document.scripts.length") == 0
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        shot = tmp_path / "live-leaderboard.png"
        driver.set_window_size(1400, 1600)
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
