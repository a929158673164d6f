"""Land one UTC day of GDELT 2.0 (96 slots × export + mentions), then parse what landed.

``ingest_day`` is what the 15-minute schedule and a backfill both run: it lands every slot of the
day that is not landed yet, so re-running a day is a no-op for landed slots and two runs of the
same day at once serialise on a per-day lock instead of racing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import polars as pl

from pipeline.config import DatasetSettings, GdeltSettings, NetworkSettings
from pipeline.gdelt.download import FetchResult, already_landed, fetch_verified, md5_of_file
from pipeline.gdelt.index import GdeltIndex, RefreshResult, day_slots
from pipeline.gdelt.integrity import UnreadableDigests, parsed_day_lock, read_digests, write_digests
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
    FileDigest,
    atomic_write_many,
    built_parquet_metadata,
    file_lock,
    parquet_bytes,
    quarantine_file,
    raw_file_name,
    remove_orphan_temps,
)

# Bump when the parsed parquet layout changes: landed slots are then parsed again.
# 2: numbers with leading spaces parse (" 3" -> 3) instead of being rejected
# 3: rejected lines are stored truncated to 4 KiB with their length and sha256
PARSED_FORMAT_VERSION = "3"


@dataclass
class DayIngest:
    day: date
    ledger: pl.DataFrame
    index_refresh: RefreshResult
    downloaded: int  # files fetched over HTTP by this run
    counts: dict[str, int] = field(default_factory=dict)


def _plan_row(previous: dict | None, day: date, slot: datetime, kind: str, now: datetime) -> dict:
    row = dict(previous) if previous else dict.fromkeys(LEDGER_SCHEMA.names())
    row.update(day=day, slot=slot, kind=kind, updated_at=now)
    row["attempts"] = row["attempts"] or 0
    row["quarantined"] = row["quarantined"] or 0
    row["first_checked_at"] = row["first_checked_at"] or now
    return row


def ingest_day(
    day: date,
    dataset: DatasetSettings,
    network: NetworkSettings,
    gdelt: GdeltSettings,
    *,
    now: datetime | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> DayIngest:
    layout = DataLayout(dataset.data_dir)
    now = now or utc_now()
    with file_lock(layout.lock_path(f"ingest-{day.isoformat()}"), dataset.day_lock_timeout_s):
        session = make_session(network, gdelt.download_concurrency)
        index = GdeltIndex(layout, network, gdelt, session)
        # The master list is shared by every day: one refresher at a time.
        with file_lock(layout.lock_path("index"), dataset.day_lock_timeout_s):
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
                if (
                    row["status"] == "quarantined"
                    and entry is not None
                    and ((entry["size"], entry["md5"]) == (row["expected_size"], row["expected_md5"]))
                ):
                    continue  # the same bytes would be refused again: only a re-publication is tried
                if slot > now:
                    row["status"] = "not_due"
                    continue
                if entry is None:
                    _mark_unavailable(row, now, gdelt, "not listed in the GDELT index")
                    continue
                row["expected_size"], row["expected_md5"] = entry["size"], entry["md5"]
                target = layout.raw_path(slot, kind)
                if already_landed(target, entry["size"], entry["md5"]):
                    _mark_landed(row, layout, target, entry["size"], now, gdelt)
                    continue
                to_fetch.append((row, entry))

        base = gdelt.base_url.rstrip("/")
        local = threading.local()

        def fetch(item: tuple[dict, dict]) -> tuple[dict, FetchResult]:
            row, entry = item
            if not hasattr(local, "session"):
                local.session = make_session(
                    network, gdelt.download_concurrency
                )  # one pooled session per worker thread
            # Fetch by name from the configured base so a mirror works with GDELT's own index.
            url = f"{base}/{raw_file_name(row['slot'], row['kind'])}"
            target = layout.raw_path(row["slot"], row["kind"])
            return row, fetch_verified(
                local.session, url, target, entry["size"], entry["md5"], network, gdelt, layout.quarantine_dir(day)
            )

        if to_fetch:
            log(f"{day}: fetching {len(to_fetch)} files with {gdelt.download_concurrency} workers")
            # A killed run's temp files, in one listing per directory (not one per file fetched).
            for directory in {layout.raw_path(row["slot"], row["kind"]).parent for row, _ in to_fetch}:
                remove_orphan_temps(directory)
            with ThreadPoolExecutor(max_workers=gdelt.download_concurrency) as pool:
                for row, result in pool.map(fetch, to_fetch):
                    _apply(row, result, layout, now, gdelt)
        session.close()

        ledger = pl.DataFrame(rows, schema=LEDGER_SCHEMA)
        write_ledger(layout, day, ledger)
    return DayIngest(day, ledger, refresh, downloaded=len(to_fetch), counts=summarize(ledger))


def _mark_unavailable(row: dict, now: datetime, gdelt: GdeltSettings, reason: str) -> None:
    row["unavailable_since"] = row["unavailable_since"] or now
    in_grace = now < row["slot"] + timedelta(hours=gdelt.missing_grace_hours)
    row["status"] = "pending" if in_grace else "missing"
    row["last_error"] = reason


def _mark_landed(row: dict, layout: DataLayout, target, size: int, now: datetime, gdelt: GdeltSettings) -> None:
    row["size"] = size
    row["path"] = str(target.relative_to(layout.root))
    row["landed_at"] = now
    was_unavailable = row["unavailable_since"] is not None
    is_late = now - row["slot"] > timedelta(hours=gdelt.late_after_hours)
    row["status"] = "late" if (was_unavailable and is_late) else "landed"


def _apply(row: dict, result: FetchResult, layout: DataLayout, now: datetime, gdelt: GdeltSettings) -> None:
    row["attempts"] += result.attempts
    row["http_status"] = result.http_status
    row["quarantined"] += len(result.quarantined)
    row["last_error"] = result.error
    if result.status == "landed":
        _mark_landed(row, layout, layout.raw_path(row["slot"], row["kind"]), result.size, now, gdelt)
    elif result.status == "not_found":
        _mark_unavailable(row, now, gdelt, result.error or "HTTP 404")
    elif result.status == "quarantined":  # not retried while the index lists the same bytes
        row["status"] = "quarantined"
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
    quarantined: list[str]  # damaged slot files (or digest table) this run moved to quarantine
    refused: dict[str, str] = field(default_factory=dict)  # raw zip this run quarantined -> why


PARSERS = {"export": parse_export, "mentions": parse_mentions}


def parse_day(day: date, kind: str, dataset: DatasetSettings, gdelt: GdeltSettings) -> DayParse:
    """Parse every landed ``kind`` file of ``day`` into ``parsed/<kind>/date=…/<ts>.parquet``.

    A slot is skipped when its parquet was built from the same raw md5 by the same format version
    and its bytes match the day's digest table (pipeline/gdelt/integrity.py), so re-runs cost one
    metadata read and one sha256 per slot. A slot file that is built but does not match, or whose
    footer no longer opens, was damaged after it was written: it is moved to quarantine with a
    note and the slot is parsed again from its raw zip (whose md5 the ledger verified). A day
    parsed before digests were recorded has its built files recorded as they are.

    The other slots are parsed by :func:`parse_files` (several files per ``pl.read_csv``, a
    thread per core); then the digest table is written, then the slot files in slot order.

    A raw file that cannot be parsed as a whole (its zip inflates past
    ``gdelt.max_uncompressed_mb``, it has the wrong column count, implausibly many lines: see
    :class:`~pipeline.gdelt.refusals.RefusedFileError`) does not stop the day: its slot becomes
    ``quarantined`` in the ledger with the reason, its zip moves to ``quarantine/gdeltv2/`` with a
    note, and the other slots are written as usual (:func:`_quarantine_refused`).
    """
    layout = DataLayout(dataset.data_dir)
    ledger = read_ledger(layout, day).filter(pl.col("kind") == kind, pl.col("status").is_in(GREEN))
    with parsed_day_lock(layout, kind, day, dataset.day_lock_timeout_s):
        quarantined: list[str] = []
        recorded, table_lost = _recorded_digests(layout, kind, day, quarantined)
        digests: dict[datetime, FileDigest] = {}
        stats: list[dict] = []
        to_parse = _slots_to_parse(layout, kind, ledger, recorded, table_lost, digests, stats, quarantined)
        refusals = _parse_slots(layout, kind, day, gdelt, to_parse, recorded, digests, stats)
        refused = _quarantine_refused(layout, kind, day, refusals, dataset.day_lock_timeout_s)
    per_slot = pl.DataFrame(
        stats, schema={"slot": pl.Datetime("us", "UTC"), "rows": pl.Int64, "rejects": pl.Int64}
    ).sort("slot")
    return DayParse(
        day=day,
        kind=kind,
        files=ledger.height,
        parsed=len(to_parse),
        rows=int(per_slot["rows"].sum()),
        rejects=int(per_slot["rejects"].sum()),
        per_slot=per_slot,
        quarantined=quarantined,
        refused=refused,
    )


# parse_day's steps, apart so that the day reads as one page (the issue's ~80-line rule); each runs
# under the day's parsed lock and appends what it moves to quarantine to ``quarantined``.


def _recorded_digests(
    layout: DataLayout, kind: str, day: date, quarantined: list[str]
) -> tuple[dict[datetime, FileDigest] | None, bool]:
    """The day's digest table (None: the day was parsed before digests were recorded), and whether
    it was lost: a table that does not read is quarantined and taken as empty."""
    try:
        return read_digests(layout, kind, day), False
    except UnreadableDigests as exc:
        # Nothing says which slot files are intact, so every slot is parsed again; only those
        # whose footer no longer opens are known to be damaged and kept in quarantine.
        bad = quarantine_file(
            layout.parsed_digests_path(kind, day),
            layout.parsed_quarantine_dir(kind, day),
            "digests.parquet",
            {"reason": str(exc), "action": "every slot of the day is parsed again"},
        )
        quarantined.append(str(bad.relative_to(layout.root)))
        return {}, True


def _slots_to_parse(
    layout: DataLayout,
    kind: str,
    ledger: pl.DataFrame,
    recorded: dict[datetime, FileDigest] | None,
    table_lost: bool,
    digests: dict[datetime, FileDigest],
    stats: list[dict],
    quarantined: list[str],
) -> list[dict]:
    """The ledger rows whose slot file must be parsed (again), in slot order; each slot file kept
    as built gets its digest and stats, and one found damaged is moved to quarantine."""
    to_parse: list[dict] = []
    for row in ledger.sort("slot").iter_rows(named=True):
        slot, out = row["slot"], layout.parsed_path(kind, row["slot"])
        meta = built_parquet_metadata(out)
        if meta is not None and _built_from(meta, row):
            found = FileDigest.of_file(out)
            expected = found if recorded is None else recorded.get(slot)
            if found == expected:
                digests[slot] = found
                stats.append({"slot": slot, "rows": int(meta["rows"]), "rejects": int(meta["rejects"])})
                continue
            if not table_lost:
                reason = "not in the digest table" if expected is None else "bytes differ from the digest table"
                quarantined.append(_quarantine_slot(layout, kind, row, reason, expected, found))
        elif meta is None and out.exists():
            # Slot files are renamed into place whole: one whose footer does not open is damaged.
            expected = (recorded or {}).get(slot)
            quarantined.append(
                _quarantine_slot(layout, kind, row, "parquet footer does not open", expected, FileDigest.of_file(out))
            )
        to_parse.append(row)
    return to_parse


def _parse_slots(
    layout: DataLayout,
    kind: str,
    day: date,
    gdelt: GdeltSettings,
    to_parse: list[dict],
    recorded: dict[datetime, FileDigest] | None,
    digests: dict[datetime, FileDigest],
    stats: list[dict],
) -> list[tuple[dict, Exception]]:
    """Parse the raw files of ``to_parse`` with :func:`parse_files`, then write the digest table
    and the slot files (:func:`_write_parsed`); return the slots refused as a whole, with why."""
    # Held until the table is written: a day of serialised files is ~12 MB at GDELT's volume.
    parsed_slots: list[tuple[datetime, bytes, bytes | None]] = []  # slot, rows file, rejects file
    # Read lazily: parse_files holds only a few batches of files at a time.
    raw_files = (((layout.root / row["path"]).read_bytes(), row["path"]) for row in to_parse)
    refusals: list[tuple[dict, Exception]] = []
    try:
        for row, parsed in zip(
            to_parse,
            parse_files(raw_files, kind, max_member_bytes=gdelt.max_uncompressed_bytes, refused="yield"),
        ):
            if isinstance(parsed, Exception):
                refusals.append((row, parsed))
                continue
            slot, md5 = row["slot"], row["expected_md5"]
            rows_file = parquet_bytes(
                parsed.rows,
                metadata={
                    "source_md5": md5,
                    "source_path": row["path"],
                    "format_version": PARSED_FORMAT_VERSION,
                    "rows": str(parsed.rows.height),
                    "rejects": str(parsed.rejects.height),
                },
            )
            rejects_file = (
                parquet_bytes(parsed.rejects, metadata={"source_md5": md5}) if parsed.rejects.height else None
            )
            parsed_slots.append((slot, rows_file, rejects_file))
            digests[slot] = FileDigest.of_bytes(rows_file)
            stats.append({"slot": slot, "rows": parsed.rows.height, "rejects": parsed.rejects.height})
    finally:
        # Slots are independent: what was parsed before a file that fails is still written.
        _write_parsed(layout, kind, day, recorded, digests, parsed_slots)
    return refusals


def _quarantine_refused(
    layout: DataLayout, kind: str, day: date, refusals: list[tuple[dict, Exception]], lock_timeout_s: float
) -> dict[str, str]:
    """Mark each refused slot ``quarantined`` in the ledger, then move its raw zip to quarantine.

    The ledger is rewritten under the day's ingest lock (the one ``ingest_day`` holds while it
    rewrites it), changing only these rows, and only while they still hold the bytes that were
    parsed. It is written before the zip moves: a crash in between leaves a zip in raw/ that
    nothing reads, never a landed slot without its zip. A parsed file an earlier format version
    built for the slot goes too: the events must not read rows of a file the ledger refuses.

    A zip that no longer has the md5 it landed with was damaged on disk, not served so by GDELT:
    its slot becomes ``corrupt`` instead, which the next ``ingest_day`` downloads again.
    """
    if not refusals:
        return {}
    now = utc_now()
    why: dict[tuple[datetime, str], tuple[str, str, str]] = {}  # (slot, kind) -> md5, status, reason
    for row, exc in refusals:
        raw = layout.root / row["path"]
        intact = raw.exists() and md5_of_file(raw) == (row["expected_size"], row["expected_md5"])
        why[(row["slot"], kind)] = (
            (row["expected_md5"], "quarantined", f"parse: {exc}")
            if intact
            else (row["expected_md5"], "corrupt", f"raw zip damaged on disk since it landed: {exc}")
        )
    with file_lock(layout.lock_path(f"ingest-{day.isoformat()}"), lock_timeout_s):
        rows = []
        for row in read_ledger(layout, day).iter_rows(named=True):
            md5, status, reason = why.get((row["slot"], row["kind"]), (None, None, None))
            if reason is not None and row["status"] in GREEN and row["expected_md5"] == md5:
                row.update(
                    status=status,
                    last_error=reason,
                    path=None,
                    updated_at=now,
                    quarantined=(row["quarantined"] or 0) + 1,
                )
            rows.append(row)
        write_ledger(layout, day, pl.DataFrame(rows, schema=LEDGER_SCHEMA))
    moved: dict[str, str] = {}
    for row, exc in refusals:
        layout.parsed_path(kind, row["slot"]).unlink(missing_ok=True)
        layout.rejects_path(kind, row["slot"]).unlink(missing_ok=True)
        raw = layout.root / row["path"]
        if raw.exists():
            _, status, reason = why[(row["slot"], kind)]
            action = (
                (
                    "the slot is quarantined in the ledger; it is fetched and parsed again only when GDELT's "
                    "index lists another size or md5 for it"
                )
                if status == "quarantined"
                else ("the slot is corrupt in the ledger; the next ingest run downloads it again")
            )
            note = {"path": row["path"], "md5": row["expected_md5"], "reason": reason, "action": action}
            bad = quarantine_file(raw, layout.quarantine_dir(day), raw.name, note)
            moved[str(bad.relative_to(layout.root))] = str(exc)
    return moved


def _built_from(meta: dict[str, str], row: dict) -> bool:
    return meta.get("source_md5") == row["expected_md5"] and meta.get("format_version") == PARSED_FORMAT_VERSION


def _quarantine_slot(
    layout: DataLayout, kind: str, row: dict, reason: str, expected: FileDigest | None, found: FileDigest
) -> str:
    path = layout.parsed_path(kind, row["slot"])
    note = {
        "path": str(path.relative_to(layout.root)),
        "reason": reason,
        "expected_sha256": expected.sha256 if expected else None,
        "expected_bytes": expected.bytes if expected else None,
        "found_sha256": found.sha256,
        "found_bytes": found.bytes,
        "source_path": row["path"],
        "source_md5": row["expected_md5"],
        "action": "the slot is parsed again from its raw zip",
    }
    bad = quarantine_file(path, layout.parsed_quarantine_dir(kind, row["slot"].date()), path.name, note)
    return str(bad.relative_to(layout.root))


def _write_parsed(
    layout: DataLayout,
    kind: str,
    day: date,
    recorded: dict[datetime, FileDigest] | None,
    digests: dict[datetime, FileDigest],
    parsed_slots: list[tuple[datetime, bytes, bytes | None]],
) -> None:
    # The table before the files (see pipeline/gdelt/integrity.py); rewritten only when it changes.
    if digests != (recorded or {}):
        write_digests(layout, kind, day, digests)
    # Every slot's rejects, then every slot's rows, each a batch of atomic writes (one fsync of
    # each directory, not one per file; ~200 files a day). Rows last: their metadata marks a slot
    # as done, so a crash before they are in place re-parses it.
    rejects = []
    for slot, _, rejects_file in parsed_slots:
        if rejects_file is not None:
            rejects.append((layout.rejects_path(kind, slot), rejects_file))
        else:
            layout.rejects_path(kind, slot).unlink(missing_ok=True)
    atomic_write_many(rejects)
    atomic_write_many([(layout.parsed_path(kind, slot), rows_file) for slot, rows_file, _ in parsed_slots])
