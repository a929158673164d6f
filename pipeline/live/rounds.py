"""Live rounds: the questions of day D built, and where a round's files are (docs/live.md); the
round is published and listed by pipeline/live/publication.py.

A round asks (t, s, o) for t = D + h, h in live.horizon_days, about pairs drawn from the
daily files of the window D − live_window_days .. D − 1 and nothing else: the builder opens only
those days' daily quads and articles (tests/test_live_rounds.py makes every other day's files
garbage and gets the same bytes). Two pools, both built with the event database's and the monthly
split's rules (pipeline/splits/database.py, pipeline/splits/split.py):

- active: pairs with test-grade activity on some window day (a (t, s, o) the monthly split would
  have made a query: a quad with daily_mentions ≥ test_min_mentions, every such quad backed by
  ≥ test_min_articles kept articles);
- quiet: pairs with some activity (a quad with daily_mentions ≥ article_min_mentions) but none
  test-grade, so that "nothing happens on t" is a real possible answer.

round_size // len(horizons) pairs are drawn, round(quiet_share × that) from the quiet pool and the
rest from the active one, each with the monthly greedy balanced sampler (splits.balanced_sample:
regions and countries of both actors, level-1 codes the pair took in the window), seeded from
(live_seed, D) by sha256. A short pool gives its place to the other; when both are short every
pair is asked and the round is smaller (the manifest records the pools' sizes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import polars as pl

from pipeline.columns import Columns
from pipeline.config import DatasetSettings, LiveSettings
from pipeline.reference import country_names, region_table
from pipeline.release.layout import ReleaseError
from pipeline.release.tables import QUERIES_COLUMNS
from pipeline.splits.database import linked_events
from pipeline.splits.split import balanced_sample, queries_from_events
from pipeline.storage import DataLayout, verified

# The draw below, as each round's manifest records it (publication.round_manifest).
LIVE_SAMPLER_VERSION = "live-balanced-greedy-v1"

QUESTIONS_COLUMNS = Columns(
    {
        "query_id": (pl.String, 'Identifier "YYYY-MM-DD-NNNN" (the round\'s day D), numbered in (date, s, o) order'),
        "round": (pl.String, "The round's day D (YYYY-MM-DD)"),
        "horizon": (pl.Int32, "Days from D to the target date"),
        "date": (pl.Date, "The target date t = D + horizon the question asks about"),
        # The pair's columns are the monthly split's.
        **QUERIES_COLUMNS.declared("s", "o", "s_name", "o_name", "s_region", "o_region"),
        "query_code": (pl.String, 'The question as MIRAI writes it, e.g. "(2024-01-03, USA, ?, CHN)"'),
        "stratum": (pl.String, "Pool the pair was drawn from, active or quiet: private, never published"),
    }
)
QUESTIONS_SCHEMA = QUESTIONS_COLUMNS.schema
PUBLISHED_COLUMNS = QUESTIONS_SCHEMA.names()[:-1]


class RoundNotReady(ReleaseError):
    """No round can be built for D (no daily files in its window, or no pair with any activity)."""


# --- identities and time ----------------------------------------------------------------------


def round_dir(data_dir: Path | str, day: date) -> Path:
    """<data_dir>/live/YYYY-MM-DD/: the round's private files (questions.parquet, manifest.json,
    baselines.json, submissions/<name>/)."""
    return DataLayout(data_dir).root / "live" / day.isoformat()


def answers_file(data_dir: Path | str, day: date, target: date) -> Path:
    """The round's resolved answers for target date ``target`` (written by live/resolve.py)."""
    return round_dir(data_dir, day) / "answers" / f"{target.isoformat()}.parquet"


def resolved_targets(data_dir: Path | str, day: date, targets: list[date]) -> list[date]:
    """Which of the round's target dates are resolved already (their answers written)."""
    return [t for t in targets if answers_file(data_dir, day, t).exists()]


def window_days(day: date, live: LiveSettings) -> list[date]:
    """D − live_window_days .. D − 1: the only days whose files the round reads."""
    return [day - timedelta(days=n) for n in range(live.window_days, 0, -1)]


def target_dates(day: date, live: LiveSettings) -> list[date]:
    return [day + timedelta(days=h) for h in live.horizon_days]


def deadline(day: date, live: LiveSettings) -> datetime:
    """00:00 UTC of the earliest target date: after it, the first answers start to happen."""
    return datetime.combine(min(target_dates(day, live)), time.min, UTC)


def round_seed(live_seed: int, day: date) -> int:
    """The round's effective seed: sha256 of (live_seed, D), so every day draws differently and a
    re-run draws the same (Python's hash() of a str changes with each process)."""
    digest = hashlib.sha256(f"mirai-live-round\0{live_seed}\0{day.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


# --- building ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    day: date
    questions: pl.DataFrame  # QUESTIONS_SCHEMA
    events: pl.DataFrame  # the window's event-database rows (EVENT_DB_SCHEMA): the baselines' history
    days_read: tuple[date, ...]
    days_missing: tuple[date, ...]
    pools: dict[str, int]  # pool sizes, by stratum
    drawn: dict[str, int]  # pairs drawn, by stratum
    seed: int

    def jsonl(self) -> bytes:
        """questions.jsonl: one object per question, PUBLISHED_COLUMNS in order."""
        published = self.questions.select(PUBLISHED_COLUMNS).with_columns(pl.col("date").dt.to_string("%Y-%m-%d"))
        return published.write_ndjson().encode()


def read_window(
    day: date, dataset: DatasetSettings, live: LiveSettings
) -> tuple[pl.DataFrame, pl.DataFrame, list[date], list[date]]:
    """(the window's event-database rows, its (date, s, o, r1) quads over the database's mentions
    threshold, the days read, the days skipped). A day is read when both its daily quads and its
    articles exist; nothing of any other day is opened."""
    layout = DataLayout(dataset.data_dir)
    days = window_days(day, live)
    read = [d for d in days if layout.daily_quads_path(d).is_file() and layout.articles_path(d).is_file()]
    missing = [d for d in days if d not in read]
    if not read:
        raise RoundNotReady(
            f"round {day}: no day of its window {days[0]} .. {days[-1]} has daily quads and articles yet"
        )
    quads = pl.scan_parquet(verified(layout, *(layout.daily_quads_path(d) for d in read))).filter(
        pl.col("daily_mentions") >= dataset.article_min_mentions
    )
    articles = pl.scan_parquet(verified(layout, *(layout.articles_path(d) for d in read)))
    events, _ = linked_events(quads, articles)
    activity = quads.select("date", "s", "o", "r1").collect()
    return events, activity, read, missing


def pools(day: date, events: pl.DataFrame, activity: pl.DataFrame, dataset: DatasetSettings) -> dict[str, pl.DataFrame]:
    """The active and quiet pools: one row per pair (s, o), sorted, with what the sampler balances
    (answer_level1: the level-1 codes the pair took in the window; both actors' regions)."""
    grade = queries_from_events(
        events, day, min_mentions=dataset.test_min_mentions, min_articles=dataset.test_min_articles
    ).select("s", "o")
    regions = region_table().select("iso3", "region")
    pairs = (
        activity.group_by("s", "o")
        .agg(pl.col("r1").unique().sort().alias("answer_level1"))
        .join(regions.rename({"iso3": "s", "region": "s_region"}), on="s", how="left")
        .join(regions.rename({"iso3": "o", "region": "o_region"}), on="o", how="left")
        # The sampler balances per category; one date for all, so only the other dimensions count.
        .with_columns(pl.lit(day).alias("date"), pl.col("s_region", "o_region").fill_null("unknown"))
        .sort("s", "o")
    )
    return {
        "active": pairs.join(grade, on=["s", "o"], how="semi", maintain_order="left"),
        "quiet": pairs.join(grade, on=["s", "o"], how="anti", maintain_order="left"),
    }


def draw_sizes(pairs: int, quiet_share: float, available: dict[str, int]) -> dict[str, int]:
    """How many pairs each pool gives: round(quiet_share × pairs) quiet, the rest active; a short
    pool's places go to the other one."""
    quiet = min(round(pairs * quiet_share), available["quiet"])
    active = min(pairs - quiet, available["active"])
    quiet = min(pairs - active, available["quiet"])
    return {"active": active, "quiet": quiet}


def build_round(day: date, dataset: DatasetSettings, live: LiveSettings) -> Round:
    """The round of ``day`` from the window's daily files; the same files and settings give the
    same questions, byte for byte."""
    horizons = live.horizon_days
    events, activity, read, missing = read_window(day, dataset, live)
    pool = pools(day, events, activity, dataset)
    sizes = draw_sizes(
        live.round_size // len(horizons),
        live.quiet_share,
        {k: v.height for k, v in pool.items()},
    )
    if not sum(sizes.values()):
        raise RoundNotReady(f"round {day}: no pair had any activity in {read[0]} .. {read[-1]}")
    seed = round_seed(live.seed, day)
    # One seed per pool: the quiet draw does not move when the active pool changes size.
    drawn = pl.concat(
        [
            balanced_sample(pool[stratum], sizes[stratum], seed + offset)
            .head(sizes[stratum])
            .select("s", "o", pl.lit(stratum).alias("stratum"))
            for offset, stratum in enumerate(("active", "quiet"))
        ]
    )
    names = country_names()
    regions = region_table().select("iso3", "region")
    questions = (
        drawn.join(pl.DataFrame({"horizon": list(horizons)}, schema={"horizon": pl.Int32}), how="cross")
        .with_columns(
            pl.lit(day.isoformat()).alias("round"),
            (pl.lit(day) + pl.duration(days=pl.col("horizon"))).cast(pl.Date).alias("date"),
        )
        .join(names.rename({"iso3": "s", "name": "s_name"}), on="s", how="left")
        .join(names.rename({"iso3": "o", "name": "o_name"}), on="o", how="left")
        .join(regions.rename({"iso3": "s", "region": "s_region"}), on="s", how="left")
        .join(regions.rename({"iso3": "o", "region": "o_region"}), on="o", how="left")
        .sort("date", "s", "o")
        .with_columns(
            pl.format(
                "{}-{}", pl.lit(day.isoformat()), (pl.int_range(pl.len()) + 1).cast(pl.String).str.zfill(4)
            ).alias("query_id"),
            pl.format("({}, {}, ?, {})", pl.col("date").dt.to_string("%Y-%m-%d"), "s", "o").alias("query_code"),
        )
        .select(QUESTIONS_SCHEMA.names())
        .match_to_schema(QUESTIONS_SCHEMA)
    )
    return Round(
        day=day,
        questions=questions,
        events=events,
        days_read=tuple(read),
        days_missing=tuple(missing),
        pools={k: v.height for k, v in pool.items()},
        drawn=sizes,
        seed=seed,
    )
