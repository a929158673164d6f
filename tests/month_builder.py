"""Hand-built month inputs (slot ledgers, daily quads, articles) for database and split tests.

Each quad is written exactly as the daily pipeline writes it, so the event database and the split
are built by the real code from files, and every threshold can sit on its boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import polars as pl

from pipeline.articles.day import ARTICLES_SCHEMA
from pipeline.articles.urls import normalize_url, url_md5
from pipeline.config import Settings
from pipeline.events.quads import QUADS_SCHEMA
from pipeline.gdelt.ledger import LEDGER_SCHEMA, write_ledger
from pipeline.splits.database import month_days
from pipeline.storage import DataLayout, atomic_write_parquet


@dataclass
class Quad:
    day: date
    s: str
    r: str
    o: str
    mentions: int
    kept: int = 1  # articles that survive the filters
    dropped: int = 0  # articles fetched but filtered out
    failed: int = 0  # source URLs whose fetch failed: no article row at all
    urls: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.urls:
            stem = f"https://news.example/{self.day}/{self.s}-{self.r}-{self.o}"
            self.urls = (
                [f"{stem}/kept-{i}" for i in range(self.kept)]
                + [f"{stem}/dropped-{i}" for i in range(self.dropped)]
                + [f"{stem}/failed-{i}" for i in range(self.failed)]
            )


def write_month(settings: Settings, month: date, quads: list[Quad], *, slot_status: str = "landed") -> None:
    write_days(settings, month_days(month), quads, slot_status=slot_status)


def write_days(settings: Settings, days: list[date], quads: list[Quad], *, slot_status: str = "landed") -> None:
    """Each day's slot ledger, daily quads and articles, from the quads dated that day."""
    layout = DataLayout(settings.dataset.data_dir)
    for day in days:
        day_quads = [q for q in quads if q.day == day]
        _write_ledger(layout, day, slot_status)
        rows = [
            {
                "date": q.day,
                "s": q.s,
                "r": q.r,
                "o": q.o,
                "r1": q.r[:2],
                "daily_mentions": q.mentions,
                "n_events": 1,
                "urls": sorted(q.urls),
                "n_urls": len(q.urls),
                "web_mention_urls": 0,
            }
            for q in day_quads
        ]
        atomic_write_parquet(
            pl.DataFrame(rows, schema=QUADS_SCHEMA).sort("date", "s", "r", "o"), layout.daily_quads_path(day)
        )
        articles = {}
        for q in day_quads:
            if q.mentions < settings.dataset.article_min_mentions:
                continue
            for url in (u for u in q.urls if "/failed-" not in u):
                norm = normalize_url(url)
                kept = "/kept-" in url
                articles[norm] = {
                    "url": norm,
                    "url_md5": url_md5(norm),
                    "day": day,
                    "fetched_at": datetime.combine(day, datetime.min.time(), UTC) + timedelta(hours=20),
                    "http_status": 200,
                    "final_url": None,
                    "title": f"Title of {norm}",
                    "text": f"Text of {norm}" if kept else "",
                    "abstract": f"Title of {norm}\nText" if kept else None,
                    "date_published": str(day),
                    "lang": "en",
                    "lang_score": 0.99,
                    "n_words": 300,
                    "extraction_error": None,
                    "kept": kept,
                    "failing_filter": None if kept else "doc_word_count",
                    "failing_value": None if kept else 3.0,
                    "paragraphs_in": 5,
                    "paragraphs_kept": 5 if kept else 0,
                    "paragraph_drops": "{}",
                    "profile": "mirai",
                }
        frame = pl.DataFrame(sorted(articles.values(), key=lambda a: a["url"]), schema=ARTICLES_SCHEMA)
        atomic_write_parquet(frame, layout.articles_path(day))


def _write_ledger(layout: DataLayout, day: date, status: str) -> None:
    start = datetime.combine(day, datetime.min.time(), UTC)
    rows = [
        {
            "day": day,
            "slot": start + timedelta(minutes=15 * i),
            "kind": kind,
            "status": status,
            "listed": True,
            "attempts": 1,
        }
        for i in range(96)
        for kind in ("export", "mentions")
    ]
    frame = pl.DataFrame(rows, schema_overrides={"attempts": pl.Int32})
    write_ledger(layout, day, frame.match_to_schema(LEDGER_SCHEMA, missing_columns="insert"))
