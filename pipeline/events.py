"""Daily orchestration of the event rules: parsed slots of a day -> ``events`` and ``daily_quads``.

Rules 1 and 6 look at everything ingested before the day. Each day leaves behind a small key
file (its event ids and URL hashes, taken before any rule) under ``keys/events/``; normalising day
D reads the key files of the days before D. Key files hold polars hashes, which are stable only
within one polars version, so each records the version and is rebuilt from the parsed rows when
it differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date

import polars as pl

from pipeline.config import Settings
from pipeline.gdelt.schema import EXPORT_SCHEMA
from pipeline.normalize import History, Normalized, daily_quads, normalize_with_report, url_hash
from pipeline.storage import DataLayout, atomic_write_parquet, read_parquet_metadata

KEYS_FORMAT = f"keys-v1/polars-{pl.__version__}"


def scan_parsed(layout: DataLayout, kind: str, day: date) -> pl.LazyFrame | None:
    directory = layout.parsed_dir(kind, day)
    if not directory.exists() or not any(directory.glob("*.parquet")):
        return None
    return pl.scan_parquet(directory / "*.parquet")


def write_event_keys(layout: DataLayout, day: date, rows: pl.LazyFrame) -> None:
    keys = (
        rows.select(
            pl.col("GLOBALEVENTID").alias("event_id"),
            url_hash("SOURCEURL").alias("url_hash"),
            pl.col("SOURCEURL").is_not_null().alias("has_url"),
            pl.col("DATEADDED").dt.date().alias("day"),
        )
        .collect()
    )
    atomic_write_parquet(keys, layout.event_keys_path(day), metadata={"keys_format": KEYS_FORMAT})


def _keys_current(layout: DataLayout, day: date) -> bool:
    path = layout.event_keys_path(day)
    return path.exists() and read_parquet_metadata(path).get("keys_format") == KEYS_FORMAT


def _key_days_before(layout: DataLayout, day: date) -> list[date]:
    directory = layout.event_keys_dir()
    if not directory.exists():
        return []
    found = (date.fromisoformat(p.stem.removeprefix("date=")) for p in directory.glob("date=*.parquet"))
    return sorted(d for d in found if d < day)


def history_fingerprint(layout: DataLayout, day: date) -> str:
    """A digest of the history a day is normalised against (which earlier days, how many key
    rows each). It changes when an earlier day is ingested later (an out-of-order backfill) or
    gains late slots: the day's events must then be rebuilt (the events_history_current check)."""
    import hashlib

    import pyarrow.parquet as pq

    digest = hashlib.sha256()
    for earlier in _key_days_before(layout, day):
        digest.update(f"{earlier}:{pq.read_metadata(layout.event_keys_path(earlier)).num_rows};".encode())
    return digest.hexdigest()[:16]


def history_before(layout: DataLayout, day: date, rows: pl.LazyFrame | None = None) -> tuple[History, list[date]]:
    """Event ids and URL first days of every ingested day before ``day``.

    With ``rows``, only the ids and URLs those rows carry are kept: the history of a year is tens
    of millions of keys, the part that can matter for one day a few thousand, and semi-joins let
    polars stream the key files instead of holding them.
    """
    days = _key_days_before(layout, day)
    for earlier in days:
        if not _keys_current(layout, earlier):
            parsed = scan_parsed(layout, "export", earlier)
            if parsed is not None:
                write_event_keys(layout, earlier, parsed)
    if not days:
        return History.empty(), []
    keys = pl.scan_parquet([layout.event_keys_path(d) for d in days])
    ids, urls = keys.select("event_id"), keys.filter("has_url").select("url_hash", "day")
    if rows is not None:
        ids = ids.join(rows.select(pl.col("GLOBALEVENTID").alias("event_id")).unique(), on="event_id", how="semi")
        urls = urls.join(rows.select(url_hash("SOURCEURL").alias("url_hash")).unique(), on="url_hash", how="semi")
    return (
        History(
            event_ids=ids.unique(),
            url_first_day=urls.group_by("url_hash").agg(pl.col("day").min().alias("first_day")),
        ),
        days,
    )


@dataclass
class DayEvents:
    day: date
    normalized: Normalized
    history_days: int


def build_events(day: date, settings: Settings) -> DayEvents:
    """Normalise ``day`` against the days ingested before it; write the events and the
    unmapped-codes report. Re-running gives byte-identical files."""
    layout = DataLayout(settings.data_dir)
    rows = scan_parsed(layout, "export", day)
    if rows is None:
        rows = EXPORT_SCHEMA.to_frame().lazy()  # a day with no landed slot gets empty outputs
    else:
        write_event_keys(layout, day, rows)
    history, days = history_before(layout, day, rows)
    normalized = normalize_with_report(rows, history)
    meta = {
        **normalized.metadata,
        "day": day.isoformat(),
        "history_days": str(len(days)),
        "history_through": days[-1].isoformat() if days else "",
        "history_fingerprint": history_fingerprint(layout, day),
        "input_rows": str(normalized.input_rows),
        "exclusions": json.dumps(normalized.exclusions, sort_keys=True),
    }
    atomic_write_parquet(normalized.events, layout.events_path(day), metadata=meta)
    atomic_write_parquet(normalized.unmapped_codes, layout.unmapped_codes_path(day), metadata={"day": day.isoformat()})
    return DayEvents(day, normalized, len(days))


def build_daily_quads(day: date, settings: Settings) -> pl.DataFrame:
    """Aggregate the day's events (and its mentions) into daily quads."""
    layout = DataLayout(settings.data_dir)
    events_path = layout.events_path(day)
    events = pl.read_parquet(events_path)
    quads = daily_quads(events, scan_parsed(layout, "mentions", day))
    meta = {k: v for k, v in read_parquet_metadata(events_path).items() if k.endswith("version")}
    atomic_write_parquet(quads, layout.daily_quads_path(day), metadata={**meta, "day": day.isoformat()})
    return quads
