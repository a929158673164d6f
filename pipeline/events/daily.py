"""Daily orchestration of the event rules: parsed slots of a day -> ``events`` and ``daily_quads``.

Rules 1 and 6 look at everything ingested before the day. Each day leaves behind a small key
file (its event ids and URL hashes, taken before any rule) under ``keys/events/``. Reading every
earlier key file for every day made a backfill quadratic in its length, so the key files are
also merged into history blocks under ``keys/history/``: the distinct event ids and the first day
of every URL of 8, 64 or 512 aligned days. Normalising day D reads the blocks that lie wholly
before D and at most 7 single key files (:func:`_history_parts`). A block records the digest of
every key file it holds and is rebuilt when one of them changed or a day in its range appeared
since, so a day back-filled after later days were built is seen like any other. Key files and
blocks are written only under the ``event-history`` lock.

Key files and blocks record ``KEYS_FORMAT``; a key file in another format is rebuilt from the
day's parsed rows, a block in another format from its key files. URL hashes are stable across
polars versions (``url_hash``), so this happens once per format change, not per polars upgrade.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from datetime import date

import polars as pl

from pipeline.config import DatasetSettings
from pipeline.events.normalize import (
    INPUT_COLUMNS,
    History,
    Normalized,
    normalize_with_report,
    url_hash,
)
from pipeline.events.quads import daily_quads
from pipeline.gdelt.schema import EXPORT_SCHEMA
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    built_parquet_metadata,
    file_lock,
    read_parquet_metadata,
    verified,
    write_sealed_parquet,
)

# keys-v2 was polars' version-bound `Expr.hash` (tagged with the polars version); keys-v3 is
# XXH3-64 (``url_hash``). Change it whenever a key's value or the key file's schema changes.
KEYS_FORMAT = "keys-v3/xxh3-64"
# History block sizes in days, largest first. Each is 8 times the next, so blocks nest: a block
# is merged from the 8 blocks (or, for the smallest, the 8 key files) inside it.
BLOCK_DAYS = (512, 64, 8)
# Blocks are written with statistics and sorted ids, so a filter on the id range of a day skips
# the row groups (and blocks) holding only older ids: ids grow with time, replays aside.
BLOCK_ROW_GROUP = 1 << 16
DEFAULT_LOCK_TIMEOUT_S = DatasetSettings().day_lock_timeout_s


def scan_parsed(layout: DataLayout, kind: str, day: date) -> pl.LazyFrame | None:
    directory = layout.parsed_dir(kind, day)
    if not directory.exists() or not any(directory.glob("*.parquet")):
        return None
    return pl.scan_parquet(directory / "*.parquet")


def event_keys(rows: pl.LazyFrame) -> pl.DataFrame:
    """The key rows of parsed export rows: what rules 1 and 6 need of them for later days."""
    return (
        rows.select(
            pl.col("GLOBALEVENTID").alias("event_id"),
            url_hash("SOURCEURL").alias("url_hash"),
            pl.col("SOURCEURL").is_not_null().alias("has_url"),
            pl.col("DATEADDED").dt.date().alias("day"),
        )
        .collect()
        .rechunk()
    )


def _history_lock(layout: DataLayout, timeout_s: float):
    return file_lock(layout.lock_path("event-history"), timeout_s)


def _write_keys(layout: DataLayout, day: date, keys: pl.DataFrame) -> None:
    # The digest is what history blocks record of the day. A file that already holds these keys
    # is left alone, so re-running a day does not make the blocks holding it look stale.
    digest = hashlib.sha256(keys.write_ipc(None, compression="uncompressed").getvalue()).hexdigest()[:32]
    if _key_digest(layout, day) != digest:
        atomic_write_parquet(
            keys, layout.event_keys_path(day), metadata={"keys_format": KEYS_FORMAT, "keys_digest": digest}
        )


def write_event_keys(
    layout: DataLayout, day: date, rows: pl.LazyFrame, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> pl.DataFrame:
    """Write the day's key file and return its key rows."""
    keys = event_keys(rows)
    with _history_lock(layout, lock_timeout_s):
        _write_keys(layout, day, keys)
    return keys


def _key_digest(layout: DataLayout, day: date) -> str | None:
    """The digest of the day's key file; None when it is missing or in an older format."""
    meta = built_parquet_metadata(layout.event_keys_path(day))
    if meta is None:  # missing or unreadable: the day's keys are (re)written from its events
        return None
    return meta.get("keys_digest") if meta.get("keys_format") == KEYS_FORMAT else None


def _key_days_before(layout: DataLayout, day: date) -> list[date]:
    directory = layout.event_keys_dir()
    if not directory.exists():
        return []
    found = (date.fromisoformat(p.stem.removeprefix("date=")) for p in directory.glob("date=*.parquet"))
    return sorted(d for d in found if d < day)


def _history_entry(layout: DataLayout, day: date) -> bytes:
    import pyarrow.parquet as pq

    return f"{day}:{pq.read_metadata(layout.event_keys_path(day)).num_rows};".encode()


def history_fingerprint(layout: DataLayout, day: date) -> str:
    """A digest of the history a day is normalised against (which earlier days, how many key
    rows each). It changes when an earlier day is ingested later (an out-of-order backfill) or
    gains late slots: the day's events must then be rebuilt (the events_history_current check)."""
    digest = hashlib.sha256()
    for earlier in _key_days_before(layout, day):
        digest.update(_history_entry(layout, earlier))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class OutdatedDay:
    """A day whose events were built against another history than the one there is now."""

    day: date
    built_against: str  # the history fingerprint recorded in the day's events file
    history_now: str


def outdated_days(layout: DataLayout) -> list[OutdatedDay]:
    """Days whose events were built against another history than the one there is now (an earlier
    day added, rebuilt or grown since), oldest first: what `history_fingerprint` says day by day,
    in one pass over the key files (each read once, not once per later day)."""
    directory = layout.events_path(date.min).parent
    if not directory.exists():
        return []
    built = sorted(date.fromisoformat(p.stem.removeprefix("date=")) for p in directory.glob("date=*.parquet"))
    key_days = _key_days_before(layout, date.max)
    digest, taken, outdated = hashlib.sha256(), 0, []
    for day in built:
        while taken < len(key_days) and key_days[taken] < day:
            digest.update(_history_entry(layout, key_days[taken]))
            taken += 1
        meta = built_parquet_metadata(layout.events_path(day))
        now = digest.copy().hexdigest()[:16]
        if meta is not None and meta.get("history_fingerprint") != now:
            outdated.append(OutdatedDay(day, meta.get("history_fingerprint", ""), now))
    return outdated


Block = tuple[date, int, dict[date, str]]  # first day, size in days, the digest of each key file in it


def _history_parts(digests: dict[date, str | None], day: date) -> tuple[list[Block], list[date]]:
    """The key files of the days before ``day`` (``digests``) as history blocks and single days.

    Blocks are aligned on day numbers (``date.toordinal() // size * size``) and used only when
    they end before ``day``, so a block's contents never depend on the day being normalised. The
    days before ``day`` are covered by whole 512-day blocks, then 64-day and 8-day blocks inside
    the last partial larger block, then at most 7 single days: a few dozen files for years of
    history. A key file in an older format (it could not be rebuilt) is always read on its own.
    """
    left = {d: g for d, g in digests.items() if g is not None}
    blocks: list[Block] = []
    for size in BLOCK_DAYS:
        for start in sorted({d.toordinal() // size * size for d in left}):
            if start + size <= day.toordinal():
                members = {d: left.pop(d) for d in sorted(left) if start <= d.toordinal() < start + size}
                blocks.append((date.fromordinal(start), size, members))
    return blocks, sorted(set(digests) - {d for _, _, members in blocks for d in members})


def _block_meta(members: dict[date, str]) -> dict[str, str]:
    return {"keys_format": KEYS_FORMAT, "days": json.dumps({d.isoformat(): g for d, g in sorted(members.items())})}


def _block_current(layout: DataLayout, block: Block) -> bool:
    first, size, members = block
    paths = [layout.event_history_path(kind, first, size) for kind in ("ids", "urls")]
    return all(built_parquet_metadata(p) == _block_meta(members) for p in paths)


def _ensure_block(layout: DataLayout, block: Block) -> None:
    """(Re)build a history block unless it holds exactly ``members`` (caller holds the lock)."""
    if _block_current(layout, block):
        return
    first, size, members = block
    if size == BLOCK_DAYS[-1]:
        keys = pl.scan_parquet([layout.event_keys_path(d) for d in members])
        ids = keys.select("event_id")
        urls = keys.filter("has_url").select("url_hash", pl.col("day").alias("first_day"))
    else:
        inner = BLOCK_DAYS[BLOCK_DAYS.index(size) + 1]
        starts = sorted({d.toordinal() // inner * inner for d in members})
        for start in starts:
            part = {d: g for d, g in members.items() if start <= d.toordinal() < start + inner}
            _ensure_block(layout, (date.fromordinal(start), inner, part))
        ids = pl.scan_parquet([layout.event_history_path("ids", date.fromordinal(s), inner) for s in starts])
        urls = pl.scan_parquet([layout.event_history_path("urls", date.fromordinal(s), inner) for s in starts])
    frames = pl.collect_all(
        [
            ids.drop_nulls().unique().sort("event_id"),
            urls.group_by("url_hash").agg(pl.col("first_day").min()).sort("url_hash"),
        ]
    )
    for kind, frame in zip(("ids", "urls"), frames):
        buf = io.BytesIO()
        frame.write_parquet(
            buf, compression="zstd", statistics=True, row_group_size=BLOCK_ROW_GROUP, metadata=_block_meta(members)
        )
        atomic_write_bytes(layout.event_history_path(kind, first, size), buf.getvalue())


def history_before(
    layout: DataLayout, day: date, keys: pl.DataFrame | None = None, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> tuple[History, list[date]]:
    """Event ids and URL first days of every ingested day before ``day``.

    With ``keys`` (the day's :func:`event_keys`), only the ids and URLs those rows carry are
    kept: the history of a year is tens of millions of keys, the part that can matter for one
    day a few thousand. The ids are first narrowed to the day's id range, which lets the reader
    skip most of every block by its statistics.
    """
    days = _key_days_before(layout, day)
    if not days:
        return History.empty(), []
    with _history_lock(layout, lock_timeout_s):
        digests = {d: _key_digest(layout, d) for d in days}
        for earlier, digest in digests.items():
            parsed = scan_parsed(layout, "export", earlier) if digest is None else None
            if parsed is not None:
                _write_keys(layout, earlier, event_keys(parsed))
                digests[earlier] = _key_digest(layout, earlier)
        blocks, singles = _history_parts(digests, day)
        for block in blocks:
            _ensure_block(layout, block)
    ids = [pl.scan_parquet(layout.event_history_path("ids", first, size)) for first, size, _ in blocks]
    urls = [pl.scan_parquet(layout.event_history_path("urls", first, size)) for first, size, _ in blocks]
    if singles:
        single = pl.scan_parquet([layout.event_keys_path(d) for d in singles])
        ids.append(single.select("event_id"))
        urls.append(single.filter("has_url").select("url_hash", pl.col("day").alias("first_day")))
    seen, url_days = pl.concat(ids).drop_nulls(), pl.concat(urls)
    if keys is not None:
        lo, hi = keys.get_column("event_id").min(), keys.get_column("event_id").max()
        seen = seen.filter(pl.col("event_id").is_between(lo, hi)) if lo is not None else seen.clear()
        seen = seen.join(keys.lazy().select("event_id").unique(), on="event_id", how="semi")
        url_days = url_days.join(keys.lazy().select("url_hash").unique(), on="url_hash", how="semi")
    return (
        History(
            event_ids=seen.unique(),
            url_first_day=url_days.group_by("url_hash").agg(pl.col("first_day").min()),
        ),
        days,
    )


@dataclass
class DayEvents:
    day: date
    normalized: Normalized
    history_days: int


def build_events(day: date, dataset: DatasetSettings) -> DayEvents:
    """Normalise ``day`` against the days ingested before it; write the events and the
    unmapped-codes report. Re-running gives byte-identical files."""
    layout = DataLayout(dataset.data_dir)
    parsed = scan_parsed(layout, "export", day)
    # Read once, for the key file and for the rules. A day with no landed slot gets empty outputs.
    rows = (EXPORT_SCHEMA.to_frame().lazy() if parsed is None else parsed).select(INPUT_COLUMNS).collect()
    if parsed is None:
        keys = event_keys(rows.lazy())
    else:
        keys = write_event_keys(layout, day, rows.lazy(), dataset.day_lock_timeout_s)
    history, days = history_before(layout, day, keys, dataset.day_lock_timeout_s)
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
    write_sealed_parquet(layout, normalized.events, layout.events_path(day), metadata=meta)
    write_sealed_parquet(
        layout, normalized.unmapped_codes, layout.unmapped_codes_path(day), metadata={"day": day.isoformat()}
    )
    return DayEvents(day, normalized, len(days))


def build_daily_quads(day: date, dataset: DatasetSettings) -> pl.DataFrame:
    """Aggregate the day's events (and its mentions) into daily quads."""
    layout = DataLayout(dataset.data_dir)
    [events_path] = verified(layout, layout.events_path(day))
    events = pl.read_parquet(events_path)
    quads = daily_quads(events, scan_parsed(layout, "mentions", day))
    meta = {k: v for k, v in read_parquet_metadata(events_path).items() if k.endswith("version")}
    write_sealed_parquet(layout, quads, layout.daily_quads_path(day), metadata={**meta, "day": day.isoformat()})
    return quads
