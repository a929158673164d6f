"""Split build time on a generated month (issue 5 goal: ≤ 30 s for ≥ 150k quads).

    .venv/bin/python bench/splits.py [--quads-per-day 5000] [--rounds 3]

1. A month of event-database quads comes from testbed.database (seeded).
2. It is turned back into the daily inputs the pipeline reads (daily_quads with source URLs,
   articles with the OBELICS decision, landed slot ledgers), so the timed part is the real code:
   - event_database: build_database_month + write (URL → article id mapping, joins, names),
   - test_split: queries, balanced sample, parquet, figures, manifest and card (build_split).
API latency for agents is measured by bench/api_latency.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine
from pipeline.articles.day import ARTICLES_SCHEMA
from pipeline.config import DatasetSettings, Settings
from pipeline.events.quads import QUADS_SCHEMA
from pipeline.gdelt.ledger import LEDGER_SCHEMA, write_ledger
from pipeline.splits.database import build_database_month, month_days, write_database_month
from pipeline.splits.split import Override, build_split
from pipeline.storage import DataLayout, atomic_write_parquet
from testbed.database import generate_event_database

MONTH = date(2024, 1, 1)


def daily_inputs(source: Path, target: Settings) -> dict[str, int]:
    """Write daily_quads, articles and slot ledgers for MONTH from a generated database month.
    Article URLs are https://news.example/<id>; the pipeline re-derives ids from them."""
    src = DataLayout(source)
    events = pl.read_parquet(src.database_path("events", MONTH))
    news = pl.read_parquet(src.database_path("news", MONTH))
    layout = DataLayout(target.data_dir)
    url = pl.concat_str(pl.lit("https://news.example/"), pl.col("article_id"))
    quads = (
        events.with_columns(
            pl.col("article_ids").list.eval(pl.concat_str(pl.lit("https://news.example/"), pl.element())).alias("urls"),
            pl.lit(1, pl.UInt32).alias("n_events"),
            pl.lit(0, pl.UInt32).alias("web_mention_urls"),
        )
        .with_columns(pl.col("urls").list.len().alias("n_urls"))
        .select(QUADS_SCHEMA.names())
        .match_to_schema(QUADS_SCHEMA)
    )
    # url_md5 is the md5 of the normalised URL, as the fetch ledger keys it (these URLs are
    # already normal). Setup only, so a Python call per article is fine.
    articles = news.select(
        url.alias("url"),
        url.map_elements(_md5, return_dtype=pl.String).alias("url_md5"),
        pl.col("date").alias("day"),
        pl.lit(datetime(2024, 2, 1, tzinfo=UTC)).alias("fetched_at"),
        pl.lit(200, pl.Int16).alias("http_status"),
        "title",
        "text",
        "abstract",
        pl.lit(True).alias("kept"),
        pl.lit("mirai").alias("profile"),
    ).match_to_schema(ARTICLES_SCHEMA, missing_columns="insert")
    for day in month_days(MONTH):
        atomic_write_parquet(quads.filter(pl.col("date") == day), layout.daily_quads_path(day))
        atomic_write_parquet(articles.filter(pl.col("day") == day), layout.articles_path(day))
        start = datetime.combine(day, datetime.min.time(), UTC)
        slots = pl.DataFrame(
            {
                "day": [day] * 192,
                "slot": [start + timedelta(minutes=15 * (i // 2)) for i in range(192)],
                "kind": ["export", "mentions"] * 96,
                "status": ["landed"] * 192,
            },
        ).match_to_schema(LEDGER_SCHEMA, missing_columns="insert")
        write_ledger(layout, day, slots)
    return {"quads": quads.height, "articles": articles.height}


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quads-per-day", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine({'polars': pl.__version__})}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="mirai-bench-splits-") as tmp:
        source, data = Path(tmp) / "generated", Path(tmp) / "data"
        t = time.perf_counter()
        generate_event_database(source, MONTH, 1, seed=0, quads_per_day=args.quads_per_day)
        settings = Settings(dataset=DatasetSettings(data_dir=data))
        sizes = daily_inputs(source, settings)
        print(
            f"inputs: {sizes['quads']:,} quads ≥ 50 mentions, {sizes['articles']:,} kept articles "
            f"(generated and written in {time.perf_counter() - t:.1f} s)"
        )
        override = Override("bench", "benchmark month", datetime(2024, 2, 1, tzinfo=UTC))
        database_s, split_s = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            db = build_database_month(MONTH, settings.dataset)
            write_database_month(db, settings.dataset, settings.articles)
            database_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            split = build_split(
                MONTH, settings.dataset, settings.gdelt, now=datetime(2024, 2, 4, tzinfo=UTC), override=override
            )
            split_s.append(time.perf_counter() - t)
        print(f"event database: {db.events.height:,} quads, {db.news.height:,} articles")
        print(f"split: {split.queries.height:,} queries, sample {split.sample.height}")
        db_med, split_med = statistics.median(database_s), statistics.median(split_s)
        print(f"event_database build  median {db_med:6.2f} s  (rounds: {', '.join(f'{s:.2f}' for s in database_s)})")
        print(f"test_split build      median {split_med:6.2f} s  (rounds: {', '.join(f'{s:.2f}' for s in split_s)})")
        print(f"database + split      median {db_med + split_med:6.2f} s   goal ≤ 30 s")


if __name__ == "__main__":
    main()
