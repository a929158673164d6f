"""Monthly test splits (MIRAI, arXiv:2407.01231, §2.3 "Test Splits Construction"; its
``dataset_construction/7_generate_test_set.py`` to ``9_generate_relation_query.py`` in
github.com/yecchen/MIRAI).

A query is (t, s, ?, o); its answer is every level-2 relation s took toward o on day t in the event
database. Split thresholds and semantics are MIRAI's, with the published scripts' bugs fixed
(docs/splits.md lists each difference).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.articles.day import ARTICLES_VERSION
from pipeline.config import DatasetSettings, GdeltSettings, data_source
from pipeline.events.normalize import RULES_VERSION
from pipeline.gdelt.ledger import read_ledger, summarize
from pipeline.reference import (
    COUNTRY_NAME_SOURCES,
    COUNTRY_NAMES_VERSION,
    COUNTRY_TABLE_VERSION,
    REGION_TABLE_VERSION,
    RELATION_DESCRIPTION_VERSION,
    RELATION_TABLE_VERSION,
    region_table,
)
from pipeline.release.layout import MIRAI_BUNDLE_DIR
from pipeline.splits.database import MonthNotReady, month_days
from pipeline.splits.mirai_export import write_bundle
from pipeline.splits.schema import QUERIES_SCHEMA, SPLIT_VERSION
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    read_parquet_metadata,
    staged_directory,
    verified,
)
from pipeline.version import code_version

SAMPLER_VERSION = "balanced-greedy-v1"
# MIRAI step 8 draws 50 candidates per step and weights the variances 1, 1, 0.4, 0.2 (dates,
# level-1 codes, regions, countries); we keep those numbers so samples stay comparable.
SAMPLER_CANDIDATES = 50
SAMPLER_WEIGHTS = {"date": 1.0, "level1": 1.0, "region": 0.4, "country": 0.2}
# A status a slot may end a month in: it landed (maybe late), or GDELT never published it and the
# ledger confirmed it missing after MIRAI_MISSING_GRACE_HOURS.
CLOSED_STATUSES = ("landed", "late", "missing")

# Where a split built here differs from what MIRAI's published scripts did (its
# dataset_construction/ scripts in github.com/yecchen/MIRAI; "step N" is script N there, bug B3 is
# explained in pipeline/articles/obelics.py); written into every manifest and dataset card.
DEVIATIONS = (
    "Database threshold is daily mentions >= 50 (MIRAI's step 3 used > 50 while its paper says 'at least 50').",
    "Dates are compared as dates, so the month's last days are included (MIRAI's step 3 compared strings and "
    "dropped November 2023 from its own test month).",
    "The balanced sample draws whole queries (MIRAI drew quad rows) and balances the regions and countries of "
    "both actors (MIRAI's code counted only Actor1's), from a seeded RNG (MIRAI set no seed).",
    "Answers are every level-2 relation of (t, s, o) in the event database, as in MIRAI step 9; the >= 100 mentions "
    "and >= 5 articles thresholds select which queries exist, not which answers count.",
    "Article ids are md5 hashes of the normalised URL (stable across months) instead of a 0..N Docid.",
    "Regions are GeoNames continents (MIRAI's continents2.csv is unpublished).",
    "Article text comes from trafilatura (MIRAI used news-please); the OBELICS filters are fixed where MIRAI's "
    "paragraph loop kept failing paragraphs (bug B3).",
)


@dataclass(frozen=True)
class Closure:
    """Whether a month may be split: every slot of every day settled and the grace period over."""

    month: date
    closed: bool
    reasons: tuple[str, ...]
    slots: dict[str, int]
    # What keeps it open, by cause, for a summary over many months (sensors/monthly.py): when the
    # grace period ends (None once over), the days gdelt_files has not run for (no slot ledger), and
    # the days whose gdelt_files slots are not settled.
    grace_until: datetime | None = None
    days_without_ledger: tuple[date, ...] = ()
    days_unsettled: tuple[date, ...] = ()

    def describe(self) -> str:
        state = "closed" if self.closed else "open"
        return f"{self.month:%Y-%m} is {state}" + ("" if self.closed else ": " + "; ".join(self.reasons))


def month_closure(month: date, dataset: DatasetSettings, now: datetime) -> Closure:
    layout = DataLayout(dataset.data_dir)
    days = month_days(month)
    ledgers = [read_ledger(layout, d) for d in days]
    slots = summarize(pl.concat(ledgers))
    reasons = []
    due = datetime.combine(days[-1] + timedelta(days=1 + dataset.split_grace_days), datetime.min.time(), UTC)
    if now < due:
        reasons.append(f"grace period runs until {due.isoformat()}")
    # Named by the asset that writes the ledger (gdelt_files) and its daily partitions, so the
    # reason says what to materialise, not which file is absent.
    no_ledger = [d for d, ledger in zip(days, ledgers) if ledger.height == 0]
    if no_ledger:
        reasons.append(
            f"{len(no_ledger)} day(s) without a slot ledger: gdelt_files not materialised "
            f"(e.g. {', '.join(d.isoformat() for d in no_ledger[:3])})"
        )
    unsettled = {k: v for k, v in slots.items() if v and k not in CLOSED_STATUSES}
    unsettled_days = [d for d, ledger in zip(days, ledgers) if (~ledger["status"].is_in(CLOSED_STATUSES)).any()]
    if unsettled:
        reasons.append(
            "slots not settled: "
            + ", ".join(f"{v} {k}" for k, v in sorted(unsettled.items()))
            + f" in gdelt_files on {len(unsettled_days)} day(s) (first {unsettled_days[0]})"
        )
    return Closure(
        month=days[0],
        closed=not reasons,
        reasons=tuple(reasons),
        slots=slots,
        grace_until=due if now < due else None,
        days_without_ledger=tuple(no_ledger),
        days_unsettled=tuple(unsettled_days),
    )


def _scan_month(dataset: DatasetSettings, month: date) -> pl.DataFrame:
    layout = DataLayout(dataset.data_dir)
    path = layout.database_path("events", month)
    if not path.exists():
        raise MonthNotReady(f"{month:%Y-%m}: no event database at {path}; materialise event_database first")
    return pl.read_parquet(verified(layout, path)[0])


def queries_from_events(events: pl.DataFrame, month: date, *, min_mentions: int, min_articles: int) -> pl.DataFrame:
    """Every (t, s, o) of the month with at least one test-grade quad (daily_mentions ≥ min_mentions)
    and all of its test-grade quads backed by ≥ min_articles kept articles; answers are all of the
    pair's relations that day in the event database (MIRAI step 7 + 9)."""
    key = ["date", "s", "o"]
    grade = (
        events.filter(pl.col("daily_mentions") >= min_mentions)
        .group_by(key)
        .agg(pl.col("n_articles").min().alias("min_articles"))
        .filter(pl.col("min_articles") >= min_articles)
    )
    answers = (
        events.join(grade, on=key, how="semi")
        .group_by(key)
        .agg(
            pl.col("r").unique().sort().alias("answer_list"),
            pl.col("r1").unique().sort().alias("answer_level1"),
            pl.col("daily_mentions").sum().alias("daily_mentions"),
            pl.col("article_ids")
            .list.explode(keep_nulls=False, empty_as_null=False)
            .n_unique()
            .cast(pl.UInt32)
            .alias("n_articles"),
            pl.col("s_name").first(),
            pl.col("o_name").first(),
        )
    )
    regions = region_table().select("iso3", "region")
    return (
        answers.join(grade, on=key, how="inner")
        .join(regions.rename({"iso3": "s", "region": "s_region"}), on="s", how="left")
        .join(regions.rename({"iso3": "o", "region": "o_region"}), on="o", how="left")
        .sort(key)
        .with_columns(
            pl.format(
                "{}-{}", pl.lit(f"{month:%Y-%m}"), (pl.int_range(pl.len()) + 1).cast(pl.String).str.zfill(5)
            ).alias("query_id"),
            pl.format("({}, {}, ?, {})", pl.col("date").dt.to_string("%Y-%m-%d"), "s", "o").alias("query_code"),
            pl.col("answer_list").map_elements(_answer_dict, return_dtype=pl.String).alias("answer_dict"),
            pl.col("min_articles").cast(pl.UInt32),
        )
        .select(QUERIES_SCHEMA.names())
        .match_to_schema(QUERIES_SCHEMA)
    )


def _answer_dict(codes: pl.Series) -> str:
    grouped: dict[str, list[str]] = {}
    for code in codes:
        grouped.setdefault(code[:2], []).append(code)
    return json.dumps(grouped, sort_keys=True)


class _Balance:
    """Counts per category with O(k) variance updates: population variance over a fixed set of
    categories is mean(c²) − mean(c)², so adding one to k counts only needs those k counts."""

    def __init__(self, categories: Iterable[str]):
        self.counts = dict.fromkeys(categories, 0)
        self.total = 0
        self.squares = 0

    def variance_after(self, keys: Sequence[str]) -> float:
        n = len(self.counts)
        squares = self.squares + sum(2 * self.counts[k] + 1 for k in keys)
        total = self.total + len(keys)
        return squares / n - (total / n) ** 2

    def add(self, keys: Sequence[str]) -> None:
        self.squares += sum(2 * self.counts[k] + 1 for k in keys)
        self.total += len(keys)
        for k in keys:
            self.counts[k] += 1


def _balance_keys(queries: pl.DataFrame) -> list[dict[str, list[str]]]:
    rows = queries.select(
        pl.col("date").dt.to_string("%Y-%m-%d"), "answer_level1", "s_region", "o_region", "s", "o"
    ).iter_rows()
    return [
        # A pair within one region counts twice for it, as for a country in both roles' counts.
        {"date": [d], "level1": list(l1), "region": [sr, orr], "country": [s, o]}
        for d, l1, sr, orr, s, o in rows
    ]


def balanced_sample(queries: pl.DataFrame, size: int, seed: int) -> pl.DataFrame:
    """Greedy balanced sample (MIRAI step 8, fixed): at each step draw SAMPLER_CANDIDATES queries
    from the pool with a seeded RNG, add the one that minimises the weighted sum of the count
    variances over dates, level-1 codes, regions and countries of both actors."""
    if queries.height <= size:
        return queries
    keys = _balance_keys(queries)
    balances = {dim: _Balance(sorted({v for k in keys for v in k[dim]})) for dim in SAMPLER_WEIGHTS}
    rng = random.Random(seed)
    pool = list(range(queries.height))
    chosen: list[int] = []
    while len(chosen) < size:
        candidates = rng.sample(range(len(pool)), min(SAMPLER_CANDIDATES, len(pool)))

        def score(position: int) -> float:
            k = keys[pool[position]]
            return sum(w * balances[dim].variance_after(k[dim]) for dim, w in SAMPLER_WEIGHTS.items())

        best = min(candidates, key=lambda p: (score(p), pool[p]))
        index = pool[best]
        pool[best] = pool[-1]
        pool.pop()
        for dim in SAMPLER_WEIGHTS:
            balances[dim].add(keys[index][dim])
        chosen.append(index)
    return queries[sorted(chosen)]


def balance_score(queries: pl.DataFrame, categories_from: pl.DataFrame) -> float:
    """The sampler's objective for a finished sample (categories from the full split)."""
    full = _balance_keys(categories_from)
    balances = {dim: _Balance(sorted({v for k in full for v in k[dim]})) for dim in SAMPLER_WEIGHTS}
    for k in _balance_keys(queries):
        for dim in SAMPLER_WEIGHTS:
            balances[dim].add(k[dim])
    return sum(w * balances[dim].variance_after([]) for dim, w in SAMPLER_WEIGHTS.items())


@dataclass(frozen=True)
class Override:
    """An operator's decision to split a month that is not closed; recorded in the manifest."""

    by: str
    reason: str
    at: datetime

    def as_dict(self) -> dict[str, str]:
        return {"by": self.by, "reason": self.reason, "at": self.at.isoformat()}


@dataclass(frozen=True)
class Split:
    month: date
    directory: Path
    queries: pl.DataFrame
    sample: pl.DataFrame
    manifest: dict


def _file_entry(path: Path, rows: int | None = None) -> dict:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    entry: dict = {"sha256": digest, "bytes": path.stat().st_size}
    if rows is not None:
        entry["rows"] = rows
    return entry


def _write_mirai_bundle(
    layout: DataLayout, month: date, queries: pl.DataFrame, sample: pl.DataFrame, staging: Path
) -> dict[str, dict]:
    """The split and the database through the month in MIRAI's file layout, under mirai/data/ of
    the split directory, so every release carries them (pipeline/splits/mirai_export.py, docs/mirai.md)."""
    files, _ = write_bundle(layout, month, queries, sample, staging / MIRAI_BUNDLE_DIR)
    return {f"{MIRAI_BUNDLE_DIR}/{name}": entry for name, entry in files.items()}


def _manifest(
    month: date,
    dataset: DatasetSettings,
    gdelt: GdeltSettings,
    *,
    closure: Closure,
    override: Override | None,
    db_meta: dict[str, str],
    db_counts: dict,
    events: pl.DataFrame,
    queries: pl.DataFrame,
    sample: pl.DataFrame,
    files: dict[str, dict],
) -> dict:
    """manifest.json of a split: what it was built from and with, its counts, and every file's
    digest; the dataset card is written from it."""
    return {
        "month": f"{month:%Y-%m}",
        "dataset_version": f"{month:%Y-%m}",
        "source": data_source(dataset, gdelt),
        "split_version": SPLIT_VERSION,
        "history_cutoff": (month - timedelta(days=1)).isoformat(),
        "distance_days": dataset.agent_distance_days,
        "seed": dataset.split_seed,
        "sample_size": dataset.split_sample_size,
        "sampler_version": SAMPLER_VERSION,
        "sampler": {"candidates_per_step": SAMPLER_CANDIDATES, "weights": SAMPLER_WEIGHTS},
        "thresholds": {
            "database_min_mentions": dataset.article_min_mentions,
            "test_min_mentions": dataset.test_min_mentions,
            "test_min_articles": dataset.test_min_articles,
        },
        "versions": {
            "rules": RULES_VERSION,
            "country_table": COUNTRY_TABLE_VERSION,
            "region_table": REGION_TABLE_VERSION,
            "relation_table": RELATION_TABLE_VERSION,
            "relation_descriptions": RELATION_DESCRIPTION_VERSION,
            # the names of the look-up and of mirai/data/info/dict_iso2alternames_GeoNames.json
            "country_names": COUNTRY_NAMES_VERSION,
            "country_name_sources": ", ".join(f"{name} {v}" for name, v in COUNTRY_NAME_SOURCES.items()),
            "articles": ARTICLES_VERSION,
            "article_profile": db_meta.get("article_profile", ""),
            "database": db_meta.get("database_version", ""),
            "code": code_version(),
        },
        "counts": {
            "queries": queries.height,
            "sample": sample.height,
            "test_grade_quads": events.filter(pl.col("daily_mentions") >= dataset.test_min_mentions).height,
            "database_events": events.height,
            "database_articles": db_counts.get("news", 0),
            "slots": closure.slots,
            "articles": {
                "selected": db_counts.get("articles_selected", 0),
                "failed": db_counts.get("articles_failed", 0),
                "stored": db_counts.get("articles_stored", 0),
                "kept": db_counts.get("articles_kept", 0),
                "linked": db_counts.get("news", 0),
            },
        },
        "closure": {"closed": closure.closed, "reasons": list(closure.reasons)},
        "override": override.as_dict() if override else None,
        "deviations": list(DEVIATIONS),
        "files": files,
    }


def build_split(
    month: date, dataset: DatasetSettings, gdelt: GdeltSettings, *, now: datetime, override: Override | None = None
) -> Split:
    """Build and publish (atomically, as one directory) the month's test split."""
    # Imported here: the card needs matplotlib, which costs ~0.5 s that nothing else should pay.
    from pipeline.splits.card import dataset_card
    from pipeline.splits.card_figures import render_figures

    month = month.replace(day=1)
    closure = month_closure(month, dataset, now)
    if not closure.closed and override is None:
        raise MonthNotReady(closure.describe() + " (an operator override with a reason can force it)")
    layout = DataLayout(dataset.data_dir)
    events = _scan_month(dataset, month)
    db_meta = read_parquet_metadata(layout.database_path("events", month))
    db_counts = json.loads(db_meta.get("counts", "{}"))
    queries = queries_from_events(
        events, month, min_mentions=dataset.test_min_mentions, min_articles=dataset.test_min_articles
    )
    sample = balanced_sample(queries, dataset.split_sample_size, dataset.split_seed)

    final = layout.split_dir(month)
    with staged_directory(final) as staging:
        split_meta = {"split_version": SPLIT_VERSION, "month": f"{month:%Y-%m}"}
        atomic_write_parquet(queries, staging / "queries.parquet", metadata=split_meta)
        atomic_write_parquet(sample, staging / "queries_sample.parquet", metadata=split_meta)
        # The months figure reads the earlier months' splits, never a later one (DataLayout.split_months).
        earlier = {m: layout.split_dir(m) / "queries.parquet" for m in layout.split_months(before=month)}
        figures = render_figures(queries, staging, month, earlier, layout)
        files = {
            "queries.parquet": _file_entry(staging / "queries.parquet", queries.height),
            "queries_sample.parquet": _file_entry(staging / "queries_sample.parquet", sample.height),
        }
        files.update({path.name: _file_entry(path) for path in sorted(figures.values())})
        files.update(_write_mirai_bundle(layout, month, queries, sample, staging))
        manifest = _manifest(
            month,
            dataset,
            gdelt,
            closure=closure,
            override=override,
            db_meta=db_meta,
            db_counts=db_counts,
            events=events,
            queries=queries,
            sample=sample,
            files=files,
        )
        atomic_write_bytes(staging / "README.md", dataset_card(manifest, queries, sample, figures).encode())
        atomic_write_bytes(staging / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return Split(month=month, directory=final, queries=queries, sample=sample, manifest=manifest)


def read_manifest(dataset: DatasetSettings, month: date) -> dict | None:
    path = DataLayout(dataset.data_dir).split_dir(month) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None
