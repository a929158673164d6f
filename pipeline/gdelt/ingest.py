"""Land one UTC day of GDELT 2.0 (96 slots × export + mentions), then parse what landed.

``ingest_day`` is what the 15-minute schedule and a backfill both run: it lands every slot of the
day that is not landed yet, so re-running a day is a no-op for landed slots and two runs of the
same day at once serialise on a per-day lock instead of racing.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Callable

import polars as pl

from pipeline.config import Settings
from pipeline.gdelt.download import FetchResult, already_landed, fetch_verified
from pipeline.gdelt.index import GdeltIndex, RefreshResult, day_slots
from pipeline.gdelt.ledger import (
    GREEN,
    LEDGER_SCHEMA,
    read_ledger,
    summarize,
    write_ledger,
)
from pipeline.gdelt.parse import parse_export, parse_files, parse_mentions
from pipeline.http import make_session, utc_now
from pipeline.storage import (
    KINDS,
    DataLayout,
    atomic_write_parquet,
    built_parquet_metadata,
    file_lock,
    raw_file_name,
)

# Bump when the parsed parquet layout changes: landed slots are then parsed again.
PARSED_FORMAT_VERSION = "2"  # 2: numbers with leading spaces parse (" 3" -> 3) instead of being rejected


@dataclass
class DayIngest:
    day: date
    ledger: pl.DataFrame
    index_refresh: RefreshResult
    downloaded: int  # files fetched over HTTP by this run
    counts: dict[str, int] = field(default_factory=dict)


def _plan_row(previous: dict | None, day: date, slot: datetime, kind: str, now: datetime) -> dict:
    row = dict(previous) if previous else {name: None for name in LEDGER_SCHEMA.names()}
    row.update(day=day, slot=slot, kind=kind, updated_at=now)
    row["attempts"] = row["attempts"] or 0
    row["quarantined"] = row["quarantined"] or 0
    row["first_checked_at"] = row["first_checked_at"] or now
    return row


def ingest_day(
    day: date,
    settings: Settings,
    *,
    now: datetime | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> DayIngest:
    layout = DataLayout(settings.data_dir)
    now = now or utc_now()
    with file_lock(layout.lock_path(f"ingest-{day.isoformat()}"), settings.day_lock_timeout_s):
        session = make_session(settings)
        index = GdeltIndex(layout, settings, session)
        # The master list is shared by every day: one refresher at a time.
        with file_lock(layout.lock_path("index"), settings.day_lock_timeout_s):
            refresh = index.refresh()
            listing = index.entries_for_day(day).entries
        if refresh.error:
            log(f"GDELT index unreachable, using the cached copy: {refresh.error}")
        listed = {(r["slot"], r["kind"]): r for r in listing.filter(pl.col("kind").is_in(KINDS)).iter_rows(named=True)}
        previous = {(r["slot"], r["kind"]): r for r in read_ledger(layout, day).iter_rows(named=True)}

        rows: list[dict] = []
        to_fetch: list[tuple[dict, dict]] = []
        for slot in day_slots(day):
            for kind in KINDS:
                row = _plan_row(previous.get((slot, kind)), day, slot, kind, now)
                rows.append(row)
                entry = listed.get((slot, kind))
                row["listed"] = entry is not None
                if row["status"] in GREEN:
                    continue
                if slot > now:
                    row["status"] = "not_due"
                    continue
                if entry is None:
                    _mark_unavailable(row, now, settings, "not listed in the GDELT index")
                    continue
                row["expected_size"], row["expected_md5"] = entry["size"], entry["md5"]
                target = layout.raw_path(slot, kind)
                if already_landed(target, entry["size"], entry["md5"]):
                    _mark_landed(row, layout, target, entry["size"], now, settings)
                    continue
                to_fetch.append((row, entry))

        base = settings.gdelt_base_url.rstrip("/")
        local = threading.local()

        def fetch(item: tuple[dict, dict]) -> tuple[dict, FetchResult]:
            row, entry = item
            if not hasattr(local, "session"):
                local.session = make_session(settings)  # one pooled session per worker thread
            # Fetch by name from the configured base so a mirror works with GDELT's own index.
            url = f"{base}/{raw_file_name(row['slot'], row['kind'])}"
            target = layout.raw_path(row["slot"], row["kind"])
            return row, fetch_verified(
                local.session, url, target, entry["size"], entry["md5"], settings, layout.quarantine_dir(day)
            )

        if to_fetch:
            log(f"{day}: fetching {len(to_fetch)} files with {settings.download_concurrency} workers")
            with ThreadPoolExecutor(max_workers=settings.download_concurrency) as pool:
                for row, result in pool.map(fetch, to_fetch):
                    _apply(row, result, layout, now, settings)
        session.close()

        ledger = pl.DataFrame(rows, schema=LEDGER_SCHEMA)
        write_ledger(layout, day, ledger)
    return DayIngest(day, ledger, refresh, downloaded=len(to_fetch), counts=summarize(ledger))


def _mark_unavailable(row: dict, now: datetime, settings: Settings, reason: str) -> None:
    row["unavailable_since"] = row["unavailable_since"] or now
    in_grace = now < row["slot"] + timedelta(hours=settings.missing_grace_hours)
    row["status"] = "pending" if in_grace else "missing"
    row["last_error"] = reason


def _mark_landed(row: dict, layout: DataLayout, target, size: int, now: datetime, settings: Settings) -> None:
    row["size"] = size
    row["path"] = str(target.relative_to(layout.root))
    row["landed_at"] = now
    was_unavailable = row["unavailable_since"] is not None
    is_late = now - row["slot"] > timedelta(hours=settings.late_after_hours)
    row["status"] = "late" if (was_unavailable and is_late) else "landed"


def _apply(row: dict, result: FetchResult, layout: DataLayout, now: datetime, settings: Settings) -> None:
    row["attempts"] += result.attempts
    row["http_status"] = result.http_status
    row["quarantined"] += len(result.quarantined)
    row["last_error"] = result.error
    if result.status == "landed":
        _mark_landed(row, layout, layout.raw_path(row["slot"], row["kind"]), result.size, now, settings)
    elif result.status == "not_found":
        _mark_unavailable(row, now, settings, result.error or "HTTP 404")
    else:  # corrupt | failed: retried by the next run
        row["status"] = result.status
        row["unavailable_since"] = row["unavailable_since"] or now


@dataclass
class DayParse:
    day: date
    kind: str
    files: int  # landed files of this kind
    parsed: int  # parsed by this run (the rest were already parsed from the same bytes)
    rows: int
    rejects: int
    per_slot: pl.DataFrame  # slot, rows, rejects


PARSERS = {"export": parse_export, "mentions": parse_mentions}


def parse_day(day: date, kind: str, settings: Settings) -> DayParse:
    """Parse every landed ``kind`` file of ``day`` into ``parsed/<kind>/date=…/<ts>.parquet``.

    A slot is skipped when its parquet was built from the same raw md5 by the same format
    version, so re-runs cost one metadata read per slot. The other slots are parsed by
    :func:`parse_files` (several files per ``pl.read_csv``, a thread per core) and written in slot
    order as their results come in.
    """
    layout = DataLayout(settings.data_dir)
    ledger = read_ledger(layout, day).filter(pl.col("kind") == kind, pl.col("status").is_in(GREEN))
    stats: list[dict] = []
    to_parse: list[dict] = []
    for row in ledger.sort("slot").iter_rows(named=True):
        out = layout.parsed_path(kind, row["slot"])
        meta = built_parquet_metadata(out) or {}
        if meta.get("source_md5") == row["expected_md5"] and meta.get("format_version") == PARSED_FORMAT_VERSION:
            stats.append({"slot": row["slot"], "rows": int(meta["rows"]), "rejects": int(meta["rejects"])})
        else:
            to_parse.append(row)
    # Read lazily: parse_files holds only a few batches of files at a time.
    raw_files = (((layout.root / row["path"]).read_bytes(), row["path"]) for row in to_parse)
    for row, parsed in zip(to_parse, parse_files(raw_files, kind)):
        slot, md5 = row["slot"], row["expected_md5"]
        rejects_out = layout.rejects_path(kind, slot)
        if parsed.rejects.height:
            atomic_write_parquet(parsed.rejects, rejects_out, metadata={"source_md5": md5})
        else:
            rejects_out.unlink(missing_ok=True)
        # Rows last: their metadata marks the slot as done, so a crash in between re-parses it.
        atomic_write_parquet(
            parsed.rows,
            layout.parsed_path(kind, slot),
            metadata={
                "source_md5": md5,
                "source_path": row["path"],
                "format_version": PARSED_FORMAT_VERSION,
                "rows": str(parsed.rows.height),
                "rejects": str(parsed.rejects.height),
            },
        )
        stats.append({"slot": slot, "rows": parsed.rows.height, "rejects": parsed.rejects.height})
    parsed_now = len(to_parse)
    per_slot = pl.DataFrame(stats, schema={"slot": pl.Datetime("us", "UTC"), "rows": pl.Int64, "rejects": pl.Int64}).sort("slot")
    return DayParse(
        day=day,
        kind=kind,
        files=ledger.height,
        parsed=parsed_now,
        rows=int(per_slot["rows"].sum()),
        rejects=int(per_slot["rejects"].sum()),
        per_slot=per_slot,
    )
