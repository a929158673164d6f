"""The monthly event database: what agents query (MIRAI, arXiv:2407.01231, §2.3; its
``dataset_construction/6_generate_final_data.py`` in github.com/yecchen/MIRAI).

Two tables per month, written once as ``database/{events,news}/month=YYYY-MM.parquet``:

- events: one row per (date, s, r, o) quad with daily_mentions ≥ MIRAI_ARTICLE_MIN_MENTIONS whose
  source articles include at least one that survived the OBELICS filters; ``article_ids`` are
  those articles. MIRAI's data_kg.csv repeats a quad once per article; one row with a list keeps
  the same information without the duplicates its ``Docids`` column carried.
- news: one row per kept article; ``date`` is the publication day (the day the URL first
  appeared in GDELT, which rule 6 of normalisation made unique per URL).

Article ids are the md5 of the normalised URL (as in the fetch ledger), not MIRAI's 0..N Docid:
an md5 never changes when a later month is added, so a month's files never need rewriting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from pipeline.articles.urls import normalize_url, url_md5
from pipeline.config import ArticleSettings, DatasetSettings
from pipeline.reference import (
    COUNTRY_TABLE_VERSION,
    RELATION_TABLE_VERSION,
    country_names,
    relation_table,
)
from pipeline.release.tables import EVENT_DB_SCHEMA, NEWS_DB_SCHEMA
from pipeline.storage import DataLayout, verified, write_sealed_parquet

DATABASE_VERSION = "database-v1"


class MonthNotReady(RuntimeError):
    """A month's database or split cannot be built yet; the message says what is missing."""


@dataclass(frozen=True)
class DatabaseMonth:
    month: date
    events: pl.DataFrame
    news: pl.DataFrame
    counts: dict[str, int]


def month_days(month: date) -> list[date]:
    first = month.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return [first + timedelta(days=i) for i in range((following - first).days)]


def _article_ids(quads: pl.LazyFrame) -> pl.DataFrame:
    """(quad key, article_id) for every source URL of the quads, keyed the way the fetch ledger
    keys articles: md5 of the normalised URL. normalize_url is Python, so it runs once per
    distinct URL (a month holds ~10^5 of them above the mentions threshold)."""
    pairs = quads.select("date", "s", "r", "o", pl.col("urls").alias("url")).explode("url").drop_nulls("url").collect()
    distinct = pairs.get_column("url").unique()
    ids = pl.DataFrame(
        {"url": distinct, "article_id": [url_md5(normalize_url(u)) for u in distinct]},
        schema={"url": pl.String, "article_id": pl.String},
    )
    return pairs.join(ids, on="url", how="left").drop("url").unique()


def linked_events(quads: pl.LazyFrame, articles: pl.LazyFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the event rows, EVENT_DB_SCHEMA, of ``quads`` already over the mentions threshold that keep
    at least one article of ``articles``; every (quad, article_id) source of ``quads``). Shared by
    the monthly database and the live rounds' window (pipeline/live/rounds.py)."""
    kept_ids = articles.filter("kept").select(pl.col("url_md5").alias("article_id")).collect()
    sources = _article_ids(quads)
    linked = sources.join(kept_ids, on="article_id", how="semi")
    names = country_names()
    events = (
        quads.select("date", "s", "r", "o", "r1", "daily_mentions")
        .collect()
        .join(
            linked.group_by("date", "s", "r", "o").agg(pl.col("article_id").unique().sort().alias("article_ids")),
            on=["date", "s", "r", "o"],
            how="inner",  # MIRAI step 6: a quad with no surviving article is not in the database
        )
        .join(names.rename({"iso3": "s", "name": "s_name"}), on="s", how="left")
        .join(names.rename({"iso3": "o", "name": "o_name"}), on="o", how="left")
        .join(relation_table().select(pl.col("code").alias("r"), pl.col("name").alias("r_name")), on="r", how="left")
        .with_columns(pl.col("article_ids").list.len().alias("n_articles"))
        .select(EVENT_DB_SCHEMA.names())
        .sort("date", "s", "r", "o")
        .match_to_schema(EVENT_DB_SCHEMA)
    )
    return events, sources


def day_inputs_missing(day: date, dataset: DatasetSettings) -> list[str]:
    """Which of the day's daily inputs (daily_quads, articles) are not stored yet."""
    layout = DataLayout(dataset.data_dir)
    paths = (("daily_quads", layout.daily_quads_path(day)), ("articles", layout.articles_path(day)))
    return [what for what, path in paths if not path.exists()]


def day_events(day: date, dataset: DatasetSettings) -> pl.DataFrame:
    """The event database's rows of one day (EVENT_DB_SCHEMA), by the month build's own rule and
    code (linked_events): the live rounds resolve a day long before its month is built."""
    missing = day_inputs_missing(day, dataset)
    if missing:
        raise MonthNotReady(f"{day}: daily inputs missing: {', '.join(missing)}")
    layout = DataLayout(dataset.data_dir)
    quads = pl.scan_parquet(verified(layout, layout.daily_quads_path(day)))
    articles = pl.scan_parquet(verified(layout, layout.articles_path(day)))
    events, _ = linked_events(quads.filter(pl.col("daily_mentions") >= dataset.article_min_mentions), articles)
    return events


def database_tables(days: list[date], span: str, dataset: DatasetSettings) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """(events, news, counts) of the event database over ``days`` from their daily quads and
    articles (every day needed; ``span`` names the span in the refusal): the monthly database's
    tables, and a live history day's (pipeline/live/history.py) with ``days`` one day."""
    layout = DataLayout(dataset.data_dir)
    missing = [
        f"{d}: {what}"
        for d in days
        for what, path in (("daily_quads", layout.daily_quads_path(d)), ("articles", layout.articles_path(d)))
        if not path.exists()
    ]
    if missing:
        raise MonthNotReady(f"{span}: {len(missing)} daily inputs missing, e.g. {missing[:5]}")
    all_quads = pl.scan_parquet(verified(layout, *(layout.daily_quads_path(d) for d in days)))
    quads = all_quads.filter(pl.col("daily_mentions") >= dataset.article_min_mentions)
    articles = pl.scan_parquet(verified(layout, *(layout.articles_path(d) for d in days)))
    kept = articles.filter("kept").select(
        pl.col("url_md5").alias("article_id"), pl.col("day").alias("date"), "url", "title", "text", "abstract"
    )
    events, sources = linked_events(quads, articles)
    unnamed = events.filter(pl.any_horizontal(pl.col("s_name", "o_name", "r_name").is_null()))
    if unnamed.height:
        raise ValueError(f"{unnamed.height} quads carry codes outside the reference tables, e.g. {unnamed.row(0)}")
    used = events.select(pl.col("article_ids").explode().unique().alias("article_id"))
    news = (
        kept.collect()
        .join(used, on="article_id", how="semi")
        .unique("article_id", keep="first")
        .select(NEWS_DB_SCHEMA.names())
        .sort("date", "article_id")
        .match_to_schema(NEWS_DB_SCHEMA)
    )
    stored = articles.select("url_md5", "kept").collect()
    selected = sources.select(pl.col("article_id").unique())
    counts = {
        "quads": all_quads.select(pl.len()).collect().item(),
        "quads_over_min_mentions": quads.select(pl.len()).collect().item(),
        "events": events.height,
        "news": news.height,
        "articles_selected": selected.height,
        # selected source URLs with no stored page: fetch failures, robots refusals, non-HTML...
        "articles_failed": selected.join(stored, left_on="article_id", right_on="url_md5", how="anti").height,
        "articles_stored": stored.height,
        "articles_kept": int(stored.get_column("kept").sum()),
        "articles_kept_unlinked": int(stored.get_column("kept").sum()) - news.height,
    }
    return events, news, counts


def build_database_month(month: date, dataset: DatasetSettings) -> DatabaseMonth:
    """The month's event and news tables from its daily quads and articles (every day needed)."""
    events, news, counts = database_tables(month_days(month), f"{month:%Y-%m}", dataset)
    return DatabaseMonth(month=month.replace(day=1), events=events, news=news, counts=counts)


def write_database_month(db: DatabaseMonth, dataset: DatasetSettings, articles: ArticleSettings) -> dict[str, Path]:
    layout = DataLayout(dataset.data_dir)
    meta = {
        "database_version": DATABASE_VERSION,
        "month": f"{db.month:%Y-%m}",
        "min_mentions": str(dataset.article_min_mentions),
        "article_profile": articles.article_profile,
        "country_table_version": COUNTRY_TABLE_VERSION,
        "relation_table_version": RELATION_TABLE_VERSION,
        "counts": json.dumps(db.counts, sort_keys=True),
    }
    paths = {"events": layout.database_path("events", db.month), "news": layout.database_path("news", db.month)}
    # Sealed: the split build refuses changed bytes, and a release sends the recorded sha256 with
    # each file for the store to check instead of reading the whole snapshot again.
    write_sealed_parquet(layout, db.events, paths["events"], metadata=meta)
    write_sealed_parquet(layout, db.news, paths["news"], metadata=meta)
    return paths


def build_event_database(month: date, dataset: DatasetSettings, articles: ArticleSettings) -> DatabaseMonth:
    db = build_database_month(month, dataset)
    write_database_month(db, dataset, articles)
    return db
