"""The digest table of a day's parsed slot files, and checking a day's stored files against it.

``parse_day`` records the sha256 and size of each parsed slot file of a day in
``parsed/digests/<kind>/date=YYYY-MM-DD.parquet``, and writes that table before the slot files.
So a slot file is never on disk without its digest recorded, and a file whose footer says it is
built (same raw md5, same format) but whose bytes differ from the table, or which the table does
not list, changed after it was written: bit rot, a bad copy or restore. A crash between the table
and a slot file leaves that slot missing or stale, which is parsed again like any unbuilt slot.

Hashing a day's parsed export files at GDELT's volume (~94 files, ~11 MB) takes ~7 ms with
hashlib (SHA-NI); decoding them takes ~80 ms and still misses damage that decodes to other values.
"""

from __future__ import annotations

import hashlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from pipeline.gdelt.download import md5_of_file
from pipeline.gdelt.ledger import GREEN, TS, read_ledger
from pipeline.storage import DataLayout, FileDigest, atomic_write_parquet, file_lock

DIGESTS_VERSION = "1"
DIGESTS_SCHEMA = pl.Schema([("slot", TS), ("path", pl.String), ("sha256", pl.String), ("bytes", pl.Int64)])


class UnreadableDigests(Exception):
    """The digest table itself is damaged: it does not open, or its rows are not the rows it was
    written with."""


def parsed_day_lock(layout: DataLayout, kind: str, day: date, timeout_s: float) -> AbstractContextManager[None]:
    """Held by ``parse_day`` while it writes a day's slot files and digest table, and by
    :func:`verify_day` while it reads them, so that neither sees the table of one run with the
    files of another."""
    return file_lock(layout.lock_path(f"parse-{kind}-{day.isoformat()}"), timeout_s)


def _rows_digest(table: pl.DataFrame) -> str:
    # Recorded in the table's footer: damage to the table that still decodes is caught too.
    lines = (f"{slot.isoformat()} {path} {sha} {size}\n" for slot, path, sha, size in table.iter_rows())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def read_digests(layout: DataLayout, kind: str, day: date) -> dict[datetime, FileDigest] | None:
    """The recorded digest of each parsed slot of the day; None when the day has no table (its
    slots were parsed before digests were recorded, or none has been parsed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = layout.parsed_digests_path(kind, day)
    if not path.exists():
        return None
    try:
        file = pq.ParquetFile(path)
        table = pl.from_arrow(file.read()).match_to_schema(DIGESTS_SCHEMA)
        recorded = (file.metadata.metadata or {}).get(b"rows_sha256", b"").decode()
    except (pa.ArrowException, OSError, pl.exceptions.PolarsError) as exc:
        raise UnreadableDigests(f"{path.relative_to(layout.root)} does not open: {exc}") from exc
    if recorded != _rows_digest(table):
        raise UnreadableDigests(f"{path.relative_to(layout.root)}: its rows do not match the digest in its footer")
    return {slot: FileDigest(sha, size) for slot, _, sha, size in table.iter_rows()}


def write_digests(layout: DataLayout, kind: str, day: date, digests: dict[datetime, FileDigest]) -> None:
    """No timestamps in it: the same slot files give the same table, byte for byte."""
    table = pl.DataFrame(
        [
            (slot, str(layout.parsed_path(kind, slot).relative_to(layout.root)), d.sha256, d.bytes)
            for slot, d in sorted(digests.items())
        ],
        schema=DIGESTS_SCHEMA,
        orient="row",
    )
    atomic_write_parquet(
        table,
        layout.parsed_digests_path(kind, day),
        metadata={"digests_version": DIGESTS_VERSION, "rows_sha256": _rows_digest(table)},
    )


@dataclass
class DayIntegrity:
    """What :func:`verify_day` found. Paths are relative to the data directory."""

    kind: str
    recorded: bool  # the day has a digest table (False: parsed before digests were recorded)
    files: int = 0  # parsed slot files hashed
    bytes: int = 0
    raw_files: int = 0  # landed raw zips hashed
    raw_bytes: int = 0
    damaged: dict[str, str] = field(default_factory=dict)  # parsed file or digest table -> what is wrong
    raw_damaged: dict[str, str] = field(default_factory=dict)  # raw zip -> what is wrong


def verify_day(layout: DataLayout, kind: str, day: date, lock_timeout_s: float) -> DayIntegrity:
    """Hash every parsed ``kind`` file of the day (what the events read: every ``*.parquet`` of
    the slot directory) against the digest table, and every landed raw zip of that kind against
    the md5 the slot ledger verified it with. Reads only."""
    with parsed_day_lock(layout, kind, day, lock_timeout_s):
        try:
            recorded = read_digests(layout, kind, day)
            result = DayIntegrity(kind, recorded=recorded is not None)
        except UnreadableDigests as exc:
            # The files cannot be judged against it: the table is what is reported (parse_day
            # quarantines it and parses the whole day again).
            result = DayIntegrity(kind, recorded=True)
            result.damaged[str(layout.parsed_digests_path(kind, day).relative_to(layout.root))] = str(exc)
            recorded = None
        directory = layout.parsed_dir(kind, day)
        on_disk = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
        for path in on_disk:
            found = FileDigest.of_file(path)
            result.files += 1
            result.bytes += found.bytes
            if recorded is None:
                continue
            expected = recorded.get(_slot_of(path))
            if expected is None:
                result.damaged[str(path.relative_to(layout.root))] = f"not in the digest table ({found.describe()})"
            elif expected != found:
                result.damaged[str(path.relative_to(layout.root))] = (
                    f"{found.describe()}; the digest table recorded {expected.describe()}"
                )
        for slot in sorted((recorded or {}).keys() - {_slot_of(p) for p in on_disk}):
            path = layout.parsed_path(kind, slot)
            result.damaged[str(path.relative_to(layout.root))] = "missing (the digest table records it)"
    ledger = read_ledger(layout, day).filter(pl.col("kind") == kind, pl.col("status").is_in(GREEN))
    for row in ledger.sort("slot").iter_rows(named=True):
        raw = layout.root / row["path"]
        if not raw.exists():
            result.raw_damaged[row["path"]] = "missing (the slot ledger says landed)"
            continue
        size, md5 = md5_of_file(raw)
        result.raw_files += 1
        result.raw_bytes += size
        if (size, md5) != (row["expected_size"], row["expected_md5"]):
            result.raw_damaged[row["path"]] = (
                f"md5 {md5}, {size} bytes; GDELT listed md5 {row['expected_md5']}, {row['expected_size']} bytes"
            )
    return result


def _slot_of(path: Path) -> datetime | None:
    """``20240101101500.parquet`` -> 2024-01-01 10:15 UTC; None for a name parse_day never writes."""
    try:
        return datetime.strptime(path.name.split(".", 1)[0], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
