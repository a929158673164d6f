"""Event database and monthly split: thresholds on their boundaries, answers, closure, determinism,
the balanced sampler."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, date, datetime

import polars as pl
import pytest
from matplotlib.image import imread

from pipeline.articles.funnel import funnel_png
from pipeline.articles.urls import url_md5
from pipeline.config import Settings
from pipeline.gdelt.ledger import write_ledger
from pipeline.gdelt.ledger_figure import month_heatmap_png, month_slot_states, read_month_ledgers, state_counts
from pipeline.reference import RELATION_DESCRIPTION_VERSION
from pipeline.splits.card_figures import month_articles, month_funnel
from pipeline.splits.database import (
    EVENT_DB_SCHEMA,
    NEWS_DB_SCHEMA,
    MonthNotReady,
    build_event_database,
)
from pipeline.splits.split import (
    QUERIES_SCHEMA,
    Override,
    balance_score,
    balanced_sample,
    build_split,
    month_closure,
    queries_from_events,
)
from pipeline.storage import DamagedFile, DataLayout, seal_problem

from .month_builder import Quad, write_month
from .settings_builder import make_settings
from .test_pictures_ops import ledger

FEB = date(2024, 2, 1)
D1, D2 = date(2024, 2, 3), date(2024, 2, 29)
AFTER_GRACE = datetime(2024, 3, 4, tzinfo=UTC)  # Feb 29 + 1 day + 3 grace days

QUADS = [
    # database threshold: 49 is out, 50 is in
    Quad(D1, "USA", "042", "CHN", 49, kept=3),
    Quad(D1, "USA", "043", "CHN", 50, kept=3),
    # a quad whose articles were all filtered out is not in the database
    Quad(D1, "USA", "051", "CHN", 80, kept=0, dropped=4),
    # query (D1, FRA, DEU): test-grade 100 with exactly 5 articles -> kept; answers also include
    # the 60-mention relation and the level-1 grouping
    Quad(D1, "FRA", "036", "DEU", 100, kept=5, dropped=2, failed=3),
    Quad(D1, "FRA", "040", "DEU", 60, kept=1),
    Quad(D1, "FRA", "190", "DEU", 70, kept=2),
    # query (D1, FRA, ITA): test-grade 100 with 4 articles -> dropped
    Quad(D1, "FRA", "036", "ITA", 100, kept=4),
    # query (D1, FRA, ESP): only 99 mentions -> no test-grade quad -> no query
    Quad(D1, "FRA", "036", "ESP", 99, kept=9),
    # query (D2, RUS, UKR): two test-grade quads, one with 4 articles -> dropped ("every" quad)
    Quad(D2, "RUS", "190", "UKR", 500, kept=8),
    Quad(D2, "RUS", "173", "UKR", 150, kept=4),
    # query (D2, UKR, RUS): both test-grade with >= 5 -> kept; last day of the month is included
    Quad(D2, "UKR", "190", "RUS", 400, kept=6),
    Quad(D2, "UKR", "112", "RUS", 100, kept=5),
]


@pytest.fixture
def month_settings(tmp_path) -> Settings:
    settings = make_settings(data_dir=tmp_path / "data")
    write_month(settings, FEB, QUADS)
    return settings


def test_event_database_keeps_quads_at_50_mentions_with_a_surviving_article(month_settings):
    db = build_event_database(FEB, month_settings.dataset, month_settings.articles)
    assert db.events.schema == EVENT_DB_SCHEMA and db.news.schema == NEWS_DB_SCHEMA
    usa = db.events.filter(pl.col("s") == "USA")
    assert usa.get_column("r").to_list() == ["043"]
    row = usa.row(0, named=True)
    assert row["s_name"] == "United States" and row["o_name"] == "China" and row["n_articles"] == 3
    assert row["r_name"].startswith("Make a visit") is False  # 043 is "Host a visit"
    assert row["r_name"] == "Host a visit"
    assert row["article_ids"] == sorted(url_md5(f"https://news.example/{D1}/USA-043-CHN/kept-{i}") for i in range(3))
    fra = db.events.filter(pl.col("s") == "FRA", pl.col("o") == "DEU", pl.col("r") == "036").row(0, named=True)
    assert fra["n_articles"] == 5  # the 2 filtered articles do not count
    # every article of the database is in the news table, dated on its publication day
    ids = set(db.events.get_column("article_ids").explode())
    assert set(db.news.get_column("article_id")) == ids
    assert db.news.filter(pl.col("date") == D2).height == 8 + 4 + 6 + 5
    assert db.counts["quads"] == len(QUADS) and db.counts["quads_over_min_mentions"] == len(QUADS) - 1
    # 3 source URLs were never stored (fetch failed): counted, and not in the database
    assert db.counts["articles_failed"] == 3
    assert db.counts["articles_selected"] == db.counts["articles_stored"] + 3
    layout = DataLayout(month_settings.dataset.data_dir)
    assert pl.read_parquet(layout.database_path("events", FEB)).equals(db.events)


def test_event_database_files_are_sealed_and_the_split_refuses_changed_bytes(month_settings):
    db = build_event_database(FEB, month_settings.dataset, month_settings.articles)
    layout = DataLayout(month_settings.dataset.data_dir)
    events = layout.database_path("events", FEB)
    assert seal_problem(layout, events) is None and seal_problem(layout, layout.database_path("news", FEB)) is None
    # A valid parquet file with one mention count changed reads fine: only the digest tells.
    db.events.with_columns(pl.col("daily_mentions") + 1).write_parquet(events)
    with pytest.raises(DamagedFile, match=r"database/events/month=2024-02\.parquet"):
        build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE)
    assert not DataLayout(month_settings.dataset.data_dir).split_dir(FEB).exists()
    build_event_database(
        FEB, month_settings.dataset, month_settings.articles
    )  # rebuilding the month restores the sealed bytes
    assert build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE).directory.exists()


def test_event_database_refuses_a_month_with_missing_days(month_settings):
    DataLayout(month_settings.dataset.data_dir).articles_path(date(2024, 2, 10)).unlink()
    with pytest.raises(MonthNotReady, match="2024-02-10: articles"):
        build_event_database(FEB, month_settings.dataset, month_settings.articles)


def test_queries_thresholds_and_answers(month_settings):
    events = build_event_database(FEB, month_settings.dataset, month_settings.articles).events
    queries = queries_from_events(events, FEB, min_mentions=100, min_articles=5)
    assert queries.schema == QUERIES_SCHEMA
    assert queries.select("date", "s", "o").rows() == [(D1, "FRA", "DEU"), (D2, "UKR", "RUS")]
    fra = queries.row(0, named=True)
    assert fra["query_id"] == "2024-02-00001" and fra["query_code"] == "(2024-02-03, FRA, ?, DEU)"
    assert fra["answer_list"] == ["036", "040", "190"]
    assert fra["answer_level1"] == ["03", "04", "19"]
    assert json.loads(fra["answer_dict"]) == {"03": ["036"], "04": ["040"], "19": ["190"]}
    assert fra["daily_mentions"] == 230 and fra["n_articles"] == 8 and fra["min_articles"] == 5
    assert (fra["s_region"], fra["o_region"]) == ("Europe", "Europe")
    ukr = queries.row(1, named=True)
    assert ukr["answer_list"] == ["112", "190"] and json.loads(ukr["answer_dict"]) == {"11": ["112"], "19": ["190"]}
    # the article rule is "every test-grade quad": lowering it to 4 admits (D1, FRA, ITA) and (D2, RUS, UKR)
    looser = queries_from_events(events, FEB, min_mentions=100, min_articles=4)
    assert looser.height == 4
    assert queries_from_events(events, FEB, min_mentions=99, min_articles=5).height == 3  # + (D1, FRA, ESP)


def test_open_month_is_refused_and_an_override_is_recorded(month_settings):
    build_event_database(FEB, month_settings.dataset, month_settings.articles)
    before_grace = datetime(2024, 3, 3, 23, 59, tzinfo=UTC)
    closure = month_closure(FEB, month_settings.dataset, before_grace)
    assert not closure.closed and "grace period" in closure.describe()
    with pytest.raises(MonthNotReady, match="grace period"):
        build_split(FEB, month_settings.dataset, month_settings.gdelt, now=before_grace)
    override = Override(by="maintainer", reason="testing the override", at=before_grace)
    split = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=before_grace, override=override)
    manifest = json.loads((split.directory / "manifest.json").read_text())
    assert manifest["override"] == {
        "by": "maintainer",
        "reason": "testing the override",
        "at": before_grace.isoformat(),
    }
    assert manifest["closure"]["closed"] is False


def test_unsettled_slots_keep_a_month_open(tmp_path):
    settings = make_settings(data_dir=tmp_path / "data")
    write_month(settings, FEB, QUADS, slot_status="pending")
    closure = month_closure(FEB, settings.dataset, AFTER_GRACE)
    assert not closure.closed and "5568 pending" in closure.describe()
    write_month(settings, FEB, QUADS, slot_status="missing")  # GDELT never published them: settled
    assert month_closure(FEB, settings.dataset, AFTER_GRACE).closed


def test_split_files_manifest_and_determinism(month_settings):
    build_event_database(FEB, month_settings.dataset, month_settings.articles)
    split = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE)
    names = sorted(p.name for p in split.directory.iterdir())
    assert {"queries.parquet", "queries_sample.parquet", "manifest.json", "README.md"} <= set(names)
    manifest = json.loads((split.directory / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (split.directory / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["bytes"] == len(data)
    assert manifest["files"]["queries.parquet"]["rows"] == 2
    assert manifest["history_cutoff"] == "2024-01-31" and manifest["seed"] == 0
    assert manifest["counts"]["slots"]["landed"] == 29 * 96 * 2
    assert manifest["override"] is None and manifest["closure"]["closed"] is True
    assert manifest["versions"]["relation_descriptions"] == RELATION_DESCRIPTION_VERSION
    first = {p.relative_to(split.directory): p.read_bytes() for p in split.directory.rglob("*") if p.is_file()}
    assert {str(p) for p in first} == {*manifest["files"], "manifest.json", "README.md"}
    again = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE)
    assert {p.relative_to(again.directory): p.read_bytes() for p in again.directory.rglob("*") if p.is_file()} == first
    assert not [p for p in split.directory.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_the_split_carries_the_months_slot_ledger_and_obelics_funnel(month_settings):
    """slot_ledger.png draws the month's stored ledgers (Feb 3 hand-written with a GDELT gap and a
    quarantined file) and obelics_funnel.png the month's articles tables; the card links both. With
    every ledger and articles file gone the split still builds, and the pictures say so."""
    layout = DataLayout(month_settings.dataset.data_dir)
    # Feb 3's six short pages failed the mirai profile's first filter, as build_articles names it.
    articles = pl.read_parquet(layout.articles_path(D1))
    articles.with_columns(pl.col("failing_filter").replace("doc_word_count", "words")).write_parquet(
        layout.articles_path(D1)
    )
    build_event_database(FEB, month_settings.dataset, month_settings.articles)
    write_ledger(layout, D1, ledger(D1, {(5, "export"): "missing", (6, "mentions"): "quarantined"}))
    override = Override(by="maintainer", reason="a quarantined file", at=AFTER_GRACE)
    split = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE, override=override)

    card = (split.directory / "README.md").read_text()
    assert "](slot_ledger.png)\n\nHow completely the month's GDELT 15-minute files were collected" in card
    assert "](obelics_funnel.png)\n\nHow many articles each OBELICS step dropped" in card
    funnel, profile = month_funnel(month_articles(layout, FEB))
    # 53 stored pages of quads at >= 50 mentions (the failed fetches have no row), 6 of them too short.
    assert profile == "mirai"
    # No "selected" bar: the stored tables cannot count the selected URLs a fetch failed on.
    assert funnel["stage"][:2].to_list() == ["stored", "extracted"] and funnel["documents"][:2].to_list() == [53] * 2
    assert funnel.filter(stage="words")["dropped"].item() == 6
    assert funnel.filter(stage="kept")["documents"].item() == 47
    assert (
        split.manifest["files"]["obelics_funnel.png"]["sha256"]
        == hashlib.sha256(funnel_png(funnel, profile)).hexdigest()
    )
    states = month_slot_states(read_month_ledgers(layout, date(2024, 2, 29)), date(2024, 2, 29))
    assert {k: n for k, n in state_counts(states).items() if n} == {
        "landed": 29 * 96 - 2,
        "missing": 1,
        "quarantined": 1,
    }
    assert split.manifest["files"]["slot_ledger.png"]["sha256"] == hashlib.sha256(month_heatmap_png(states)).hexdigest()
    for name, (width, height) in {
        "slot_ledger.png": (1200, 700),
        "obelics_funnel.png": (1000, 140 + 40 * funnel.height),
    }.items():
        path = split.directory / name
        assert imread(path).shape[:2] == (height, width)
        assert split.manifest["files"][name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

    for path in [*(layout.root / "ledger" / "slots").iterdir(), *(layout.root / "articles").iterdir()]:
        path.unlink()
    bare = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE, override=override)
    assert month_funnel(month_articles(layout, FEB))[0]["documents"].to_list() == [0] * funnel.height
    nothing = month_slot_states(read_month_ledgers(layout, date(2024, 2, 29)), date(2024, 2, 29))
    assert bare.manifest["files"]["slot_ledger.png"]["sha256"] == hashlib.sha256(month_heatmap_png(nothing)).hexdigest()
    assert state_counts(nothing)["no ledger"] == 29 * 96
    for name in ("slot_ledger.png", "obelics_funnel.png"):
        imread(bare.directory / name)
        assert bare.manifest["files"][name]["sha256"] != split.manifest["files"][name]["sha256"]


def test_the_months_figure_reads_earlier_splits_and_never_a_later_one(month_settings):
    """queries_by_month.png of 2024-02 changes when a 2024-01 split appears, never for a 2024-03 one;
    the manifest's sha256 follows the bytes."""
    build_event_database(FEB, month_settings.dataset, month_settings.articles)
    layout = DataLayout(month_settings.dataset.data_dir)

    def months_figure() -> bytes:
        split = build_split(FEB, month_settings.dataset, month_settings.gdelt, now=AFTER_GRACE)
        data = (split.directory / "queries_by_month.png").read_bytes()
        assert split.manifest["files"]["queries_by_month.png"]["sha256"] == hashlib.sha256(data).hexdigest()
        return data

    alone = months_figure()
    queries = pl.read_parquet(layout.split_dir(FEB) / "queries.parquet")
    for month in (date(2024, 3, 1), date(2025, 1, 1)):
        layout.split_dir(month).mkdir(parents=True)
        pl.concat([queries] * 3).write_parquet(layout.split_dir(month) / "queries.parquet")
    assert months_figure() == alone
    layout.split_dir(date(2024, 1, 1)).mkdir(parents=True)
    queries.write_parquet(layout.split_dir(date(2024, 1, 1)) / "queries.parquet")
    assert months_figure() != alone


def _synthetic_queries(n: int, seed: int) -> pl.DataFrame:
    """Skewed like GDELT: a few countries, dates and level-1 codes dominate."""
    rng = random.Random(seed)
    countries = [
        "USA",
        "CHN",
        "RUS",
        "UKR",
        "ISR",
        "PSE",
        "IRN",
        "GBR",
        "FRA",
        "DEU",
        "IND",
        "PAK",
        "JPN",
        "KOR",
        "TUR",
        "EGY",
    ]
    regions = {
        "USA": "North America",
        "GBR": "Europe",
        "FRA": "Europe",
        "DEU": "Europe",
        "RUS": "Europe",
        "UKR": "Europe",
        "TUR": "Asia",
        "EGY": "Africa",
    }
    rows = []
    for i in range(n):
        s, o = rng.choices(countries, weights=[1 / (k + 1) for k in range(len(countries))], k=2)
        day = date(2024, 2, min(29, 1 + int(rng.expovariate(0.15))))
        codes = sorted(
            {rng.choice(["01", "04", "04", "04", "03", "19", "05", "11", "17"]) + "0" for _ in range(rng.randint(1, 3))}
        )
        rows.append(
            {
                "query_id": f"2024-02-{i:05d}",
                "date": day,
                "s": s,
                "o": o,
                "s_region": regions.get(s, "Asia"),
                "o_region": regions.get(o, "Asia"),
                "answer_list": codes,
                "answer_level1": sorted({c[:2] for c in codes}),
            }
        )
    return pl.DataFrame(rows).match_to_schema(QUERIES_SCHEMA, missing_columns="insert")


def test_balanced_sample_beats_random_samples():
    queries = _synthetic_queries(2000, seed=1)
    sample = balanced_sample(queries, 100, seed=0)
    assert sample.height == 100 and sample.get_column("query_id").is_unique().all()
    ours = balance_score(sample, queries)
    randoms = [balance_score(queries.sample(100, seed=k), queries) for k in range(20)]
    assert ours < min(randoms)
    assert balanced_sample(queries, 100, seed=0).equals(sample)  # seeded
    assert not balanced_sample(queries, 100, seed=1).equals(sample)
    assert balanced_sample(queries.head(50), 100, seed=0).height == 50  # small months keep every query
