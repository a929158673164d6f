"""The event database a live participant may forecast from (docs/live.md, "The history a
participant may use"), published as immutable daily parts: for each closed day d,
``live/history/<d>/events.parquet`` and ``news.parquet`` (the monthly database's tables restricted
to d, built by its own code, pipeline/splits/database.py ``database_tables``), then
``manifest.json`` (each file's sha256, bytes and rows; written last, once), and
``live/history/index.json``, the list of published days, rebuilt from one bounded listing.

A part is published once: a re-run that builds the same tables verifies the store's copy and
changes nothing; one that builds other tables is refused (ReleaseConflict), as a round or a
release is. A day is published only once it is over (now ≥ d + 1 00:00 UTC, the clock a round's
publication uses) and its daily quads and articles are stored, so the history of round D is what
the round itself was drawn from: the daily files through D − 1.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import polars as pl

from pipeline.config import ArticleSettings, DatasetSettings, GdeltSettings, data_source
from pipeline.live.publication import put_once
from pipeline.reference import COUNTRY_TABLE_VERSION, RELATION_TABLE_VERSION
from pipeline.release.layout import (
    DATABASE_TABLES,
    LIVE_HISTORY_DIR,
    LIVE_HISTORY_FILES,
    LIVE_HISTORY_INDEX_KEY,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    ReleaseError,
    UnsafeRelease,
    is_day,
    live_history_key,
    load_json,
)
from pipeline.release.publish import IMMUTABLE_CACHE, POINTER_CACHE, ReleaseConflict, sha256_hex
from pipeline.release.store import ReleaseStore
from pipeline.splits.database import DATABASE_VERSION, database_tables, day_inputs_missing
from pipeline.storage import parquet_bytes
from pipeline.version import code_version

HISTORY_FORMAT = "mirai-live-history-v1"
HISTORY_INDEX_FORMAT = "mirai-live-history-index-v1"
# live/history/ holds 3 keys a day: 20,000 is over 18 years of days.
MAX_HISTORY_KEYS = 20_000
# A day's table is a few MB (news text included); a file past this is no part of ours.
MAX_HISTORY_FILE_BYTES = 2**30
_SHA256 = re.compile(r"[0-9a-f]{64}")


class HistoryRefused(ReleaseError):
    """The day cannot be published yet: it is not over, or its daily files are not stored."""


@dataclass(frozen=True)
class HistoryPublication:
    day: date
    manifest: dict
    published_now: bool  # False: the same tables were already in the store (verified)
    rows: dict[str, int]  # {"events": n, "news": n}
    index_written: bool


def history_tables(day: date, dataset: DatasetSettings) -> tuple[dict[str, pl.DataFrame], dict]:
    """({"events": ..., "news": ...}, counts) of day ``day``: the monthly database's rule and code
    over that one day's daily files."""
    events, news, counts = database_tables([day], day.isoformat(), dataset)
    return {"events": events, "news": news}, counts


def _file_bytes(
    tables: dict[str, pl.DataFrame], day: date, dataset: DatasetSettings, articles: ArticleSettings
) -> dict[str, bytes]:
    """{file name: parquet bytes}, with the monthly files' key-value metadata for one day."""
    meta = {
        "database_version": DATABASE_VERSION,
        "day": day.isoformat(),
        "min_mentions": str(dataset.article_min_mentions),
        "article_profile": articles.article_profile,
        "country_table_version": COUNTRY_TABLE_VERSION,
        "relation_table_version": RELATION_TABLE_VERSION,
    }
    return {f"{table}.parquet": parquet_bytes(tables[table], meta) for table in DATABASE_TABLES}


def history_manifest(
    day: date, files: dict[str, bytes], tables: dict[str, pl.DataFrame], counts: dict, source: dict, now: datetime
) -> dict:
    return {
        "format": HISTORY_FORMAT,
        "day": day.isoformat(),
        "database_version": DATABASE_VERSION,
        "files": {
            name: {"sha256": sha256_hex(data), "bytes": len(data), "rows": tables[name.removesuffix(".parquet")].height}
            for name, data in files.items()
        },
        "counts": counts,
        "source": source,
        "published_at": now.astimezone(UTC).isoformat(timespec="seconds"),
        "code_version": code_version(),
    }


def check_history_manifest(raw: bytes, day: str, where: str) -> dict:
    """A history day's manifest once its format, day and files hold: exactly LIVE_HISTORY_FILES,
    each with 64 lowercase hex digits of sha256 and a size in [0, MAX_HISTORY_FILE_BYTES]. The
    store may be hostile: this is what a participant's download trusts."""
    manifest = load_json(raw, where)
    if not isinstance(manifest, dict) or manifest.get("format") != HISTORY_FORMAT or manifest.get("day") != day:
        raise UnsafeRelease(f"{where} is not the {HISTORY_FORMAT} manifest of day {day}; refused, nothing was written")
    files = manifest.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(LIVE_HISTORY_FILES):
        names = sorted(files)[:5] if isinstance(files, dict) else files
        raise UnsafeRelease(
            f"{where}: its files {str(names)[:120]} are not {', '.join(LIVE_HISTORY_FILES)}; refused, nothing was written"
        )
    for name, meta in files.items():
        digest = meta.get("sha256") if isinstance(meta, dict) else None
        size = meta.get("bytes") if isinstance(meta, dict) else None
        if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise UnsafeRelease(
                f"{where}: {name} has no sha256 of 64 lowercase hex digits; refused, nothing was written"
            )
        if type(size) is not int or not 0 <= size <= MAX_HISTORY_FILE_BYTES:
            raise UnsafeRelease(
                f"{where}: {name} has the size {str(size)[:40]!r}, not an integer from 0 to "
                f"{MAX_HISTORY_FILE_BYTES:,}; refused, nothing was written"
            )
    return manifest


def _same_tables(store: ReleaseStore, day: date, theirs: dict, ours: dict[str, bytes]) -> bool:
    """Whether the store's files of ``day`` match their manifest and hold the tables built now: the
    same bytes, or (another polars writing the same rows) the same frames."""
    for name, data in ours.items():
        key, meta = live_history_key(day.isoformat(), name), theirs["files"][name]
        info = store.stat(key)
        if info is None or info.size != meta["bytes"] or info.sha256 not in (None, meta["sha256"]):
            raise ReleaseConflict(
                f"{key} in {store.description} does not match its day's {MANIFEST_NAME} (missing, or other "
                "bytes); a published history day is never rewritten: find out who wrote it"
            )
        if meta["sha256"] == sha256_hex(data):
            continue
        stored = store.get_bytes(key, limit=MAX_HISTORY_FILE_BYTES) or b""
        if sha256_hex(stored) != meta["sha256"] or not pl.read_parquet(io.BytesIO(stored)).equals(
            pl.read_parquet(io.BytesIO(data))
        ):
            return False
    return True


def publish_history_day(
    day: date,
    dataset: DatasetSettings,
    articles: ArticleSettings,
    gdelt: GdeltSettings,
    store: ReleaseStore,
    *,
    now: datetime,
) -> HistoryPublication:
    """Publish day ``day``'s part of the live history: its two tables, then its manifest (its
    presence means the day is published), each written once, then live/history/index.json. Refused
    (HistoryRefused) before the day is over or while a daily file is missing; a re-run that builds
    other tables than the published ones is refused (ReleaseConflict) and overwrites nothing."""
    over = datetime.combine(day + timedelta(days=1), time.min, UTC)
    if now < over:
        raise HistoryRefused(f"history day {day} is not over until {over.isoformat()}; it is published after that")
    missing = day_inputs_missing(day, dataset)
    if missing:
        raise HistoryRefused(f"history day {day} waits for {' and '.join(f'{m} {day}' for m in missing)}")
    tables, counts = history_tables(day, dataset)
    files = _file_bytes(tables, day, dataset, articles)
    manifest_key = live_history_key(day.isoformat(), MANIFEST_NAME)
    where = f"{manifest_key} in {store.description}"
    raw = store.get_bytes(manifest_key, limit=MAX_JSON_BYTES)
    written = False
    if raw is None:
        for name, data in files.items():
            problem = put_once(store, live_history_key(day.isoformat(), name), data, IMMUTABLE_CACHE)
            if problem:
                raise ReleaseConflict(f"history day {day}: {problem}; a published history day is never rewritten")
        ours = history_manifest(day, files, tables, counts, data_source(dataset, gdelt), now)
        raw = (json.dumps(ours, indent=2) + "\n").encode()
        written = store.put_bytes(manifest_key, raw, cache_control=IMMUTABLE_CACHE, if_absent=True)
        raw = raw if written else store.get_bytes(manifest_key, limit=MAX_JSON_BYTES) or b""
    theirs = check_history_manifest(raw, day.isoformat(), where)
    if not _same_tables(store, day, theirs, files):
        raise ReleaseConflict(
            f"history day {day}: {where} holds other tables than the ones built now from its daily files; a "
            "published history day is never rewritten: look at what changed in the day's files"
        )
    return HistoryPublication(
        day=day,
        manifest=theirs,
        published_now=written,
        rows={table: tables[table].height for table in DATABASE_TABLES},
        index_written=write_history_index(store),
    )


def _indexed(store: ReleaseStore) -> dict[str, str]:
    """{day: manifest sha256} of our current index, or {} when there is none or it is not ours:
    a listed day's manifest is immutable, so its sha256 need not be read again."""
    raw = store.get_bytes(LIVE_HISTORY_INDEX_KEY, limit=MAX_JSON_BYTES)
    try:
        index = json.loads(raw) if raw is not None else None
    except ValueError:
        return {}
    days = index.get("days") if isinstance(index, dict) and index.get("format") == HISTORY_INDEX_FORMAT else None
    if not isinstance(days, list):
        return {}
    return {
        e["day"]: e["manifest_sha256"] for e in days if isinstance(e, dict) and {"day", "manifest_sha256"} <= set(e)
    }


def history_index(store: ReleaseStore) -> dict:
    """Every published day (its manifest is there), oldest first, with its manifest's key and
    sha256, from one bounded listing of live/history/."""
    listing = store.list_keys(f"{LIVE_HISTORY_DIR}/", max_keys=MAX_HISTORY_KEYS)
    if listing.truncated:
        raise ReleaseError(f"{store.description}: more than {MAX_HISTORY_KEYS} keys under {LIVE_HISTORY_DIR}/; refused")
    published = sorted(
        day
        for day, _, name in (i.key.removeprefix(f"{LIVE_HISTORY_DIR}/").partition("/") for i in listing.keys)
        if is_day(day) and name == MANIFEST_NAME
    )
    known = _indexed(store)
    days = []
    for day in published:
        key = live_history_key(day, MANIFEST_NAME)
        digest = known.get(day)
        if digest is None:
            raw = store.get_bytes(key, limit=MAX_JSON_BYTES) or b""
            check_history_manifest(raw, day, f"{key} in {store.description}")
            digest = sha256_hex(raw)
        days.append({"day": day, "manifest": key, "manifest_sha256": digest})
    return {"format": HISTORY_INDEX_FORMAT, "through": published[-1] if published else None, "days": days}


def write_history_index(store: ReleaseStore) -> bool:
    """Rewrite live/history/index.json (one PUT, or an atomic rename on a local store) when it
    changed; whether it was written."""
    data = (json.dumps(history_index(store), indent=2) + "\n").encode()
    if store.get_bytes(LIVE_HISTORY_INDEX_KEY, limit=MAX_JSON_BYTES) == data:
        return False
    store.put_bytes(LIVE_HISTORY_INDEX_KEY, data, cache_control=POINTER_CACHE, if_absent=False)
    return True
