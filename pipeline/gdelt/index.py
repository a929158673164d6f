"""GDELT's own file index: ``lastupdate.txt`` (newest slot) and ``masterfilelist.txt`` (every file
ever published, ~115 MB, append-only). Both are lines of ``<bytes> <md5> <url>``.

The index is the source of truth for what should exist and what its bytes must be. We keep a
local copy of the master list and refresh it with an HTTP Range request from the size we hold,
so a 15-minute run transfers a few KB instead of 115 MB.

Whoever serves the index may be hostile (docs/data-layout.md, "Hostile GDELT files"): every body
is read as a stream and counted as it is decoded (a server may answer with Content-Encoding: gzip
whatever the file), and refused past :data:`MAX_LAST_UPDATE_BYTES` or
:data:`MAX_MASTER_LIST_BYTES` (:class:`IndexTooLarge`); the cached copy then stays in use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import requests

from pipeline.config import GdeltSettings, NetworkSettings
from pipeline.http import TransientHTTPError, raise_for_transient, with_retries
from pipeline.storage import DataLayout, atomic_write_bytes, commit_temp, temp_path_for

MASTER_LIST = "masterfilelist.txt"
LAST_UPDATE = "lastupdate.txt"
SLOT = timedelta(minutes=15)
# lastupdate.txt lists the newest slot's three files: 321 bytes in a 2018 copy (the tests'
# fixtures, github.com/epournaras/DIAS-GDELT). 64 KiB is 200 times that.
MAX_LAST_UPDATE_BYTES = 64 * 2**10
# masterfilelist.txt lists every file since February 2015, ~115 MB today and growing ~11 MB a
# year (three lines of ~107 bytes every 15 minutes, as in its first 1000 lines in the fixtures).
# entries_for_day holds it whole, so it is never let past this: 4.6x today, decades of growth.
MAX_MASTER_LIST_BYTES = 512 * 2**20
# Bodies are read this much at a time, counted after decoding (urllib3 >= 2.6 bounds each decoding
# step to the bytes asked for, so a gzip bomb is stopped within one step of the cap).
_CHUNK_BYTES = 1 << 20

ENTRY_SCHEMA = pl.Schema(
    [
        ("slot", pl.Datetime("us", "UTC")),
        ("kind", pl.String),  # export | mentions | gkg | translation.export | ...
        ("size", pl.Int64),
        ("md5", pl.String),
        ("name", pl.String),
        ("url", pl.String),
    ]
)
BAD_LINE_SCHEMA = pl.Schema([("line_number", pl.Int64), ("line", pl.String)])

# <size> <md5> <url ending in /YYYYMMDDHHMMSS.<kind>.(CSV|csv).zip>
_LINE = r"^(\d+) ([0-9a-fA-F]{32}) (\S*/((\d{14})\.([a-z.]+)\.(?:CSV|csv)\.zip))$"


class IndexTooLarge(ValueError):
    """A file of GDELT's index is larger than it can be (the message names it and the cap)."""


def _read_capped(resp: requests.Response, cap: int) -> bytes:
    """``resp``'s decoded body, refused (IndexTooLarge) as soon as it passes ``cap`` bytes."""
    parts, size = [], 0
    for chunk in resp.iter_content(_CHUNK_BYTES):
        size += len(chunk)
        if size > cap:
            raise IndexTooLarge(f"{resp.url}: more than {cap:,} bytes (decoded); refused")
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class IndexTable:
    entries: pl.DataFrame  # ENTRY_SCHEMA
    bad_lines: pl.DataFrame  # BAD_LINE_SCHEMA: lines that do not follow the format


def parse_index(data: bytes, first_line_number: int = 1) -> IndexTable:
    """Parse lastupdate/masterfilelist text. Malformed lines are returned, never dropped silently."""
    text = data.decode("utf-8", errors="replace").replace("\r", "")
    lines = pl.DataFrame({"line": text.split("\n")}).with_row_index("line_number", offset=first_line_number)
    lines = lines.with_columns(pl.col("line_number").cast(pl.Int64)).filter(pl.col("line").str.strip_chars() != "")
    parsed = lines.with_columns(pl.col("line").str.extract_groups(_LINE).alias("p")).unnest("p")
    # A 14-digit stamp that is not a real time (month 13) makes the line malformed too.
    parsed = parsed.with_columns(
        pl.col("5").str.to_datetime("%Y%m%d%H%M%S", time_zone="UTC", strict=False).dt.cast_time_unit("us").alias("slot")
    )
    ok = pl.col("slot").is_not_null()
    entries = parsed.filter(ok).select(
        "slot",
        pl.col("6").alias("kind"),
        pl.col("1").cast(pl.Int64).alias("size"),
        pl.col("2").str.to_lowercase().alias("md5"),
        pl.col("4").alias("name"),
        pl.col("3").alias("url"),
    )
    bad = parsed.filter(~ok).select("line_number", "line")
    return IndexTable(entries=entries.match_to_schema(ENTRY_SCHEMA), bad_lines=bad.match_to_schema(BAD_LINE_SCHEMA))


def day_slots(day: date) -> list[datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return [start + i * SLOT for i in range(96)]


def slot_gaps(entries: pl.DataFrame, start: datetime, end: datetime, kinds=("export", "mentions")) -> pl.DataFrame:
    """Slots in [start, end] where at least one of ``kinds`` is not listed.

    Returns (slot, missing_kinds) sorted by slot: GDELT outages show up here.
    """
    slots = pl.datetime_range(start, end, "15m", time_unit="us", time_zone="UTC", eager=True).alias("slot")
    listed = entries.filter(pl.col("kind").is_in(list(kinds))).select("slot", "kind").unique()
    expected = pl.DataFrame(slots).join(pl.DataFrame({"kind": list(kinds)}), how="cross")
    missing = expected.join(listed, on=["slot", "kind"], how="anti")
    return missing.group_by("slot").agg(pl.col("kind").sort().alias("missing_kinds")).sort("slot")


def day_region(data: bytes, day: date) -> tuple[bytes, int]:
    """The lines of a master list that can mention ``day``, and the line number they start at.

    The list is append-only and (nearly) time-ordered, so everything about one day lies between
    the first and last occurrence of ``/YYYYMMDD``; memchr-speed search instead of parsing 115 MB.
    """
    needle = f"/{day:%Y%m%d}".encode()
    first = data.find(needle)
    if first < 0:
        return b"", 1
    last = data.rfind(needle)
    begin = data.rfind(b"\n", 0, first) + 1
    end = data.find(b"\n", last)
    end = len(data) if end < 0 else end
    return data[begin:end], data.count(b"\n", 0, begin) + 1


@dataclass(frozen=True)
class RefreshResult:
    mode: str  # "range" (appended), "unchanged", "full" (downloaded whole), "cached" (server unreachable)
    bytes_transferred: int
    size: int
    error: str | None = None


class GdeltIndex:
    """The local copy of GDELT's index under ``$MIRAI_DATA_DIR/index/gdeltv2``.

    Callers serialise refreshes with the ``index`` lock (see pipeline.ingest).
    """

    # Re-fetched bytes that must equal the tail we hold: proves the server's file still starts
    # with our copy before we append to it (if GDELT ever rewrites the list, we re-download).
    OVERLAP = 4096

    def __init__(self, layout: DataLayout, network: NetworkSettings, gdelt: GdeltSettings, session: requests.Session):
        self.dir = layout.index_dir()
        self.network, self.gdelt = network, gdelt
        self.session = session

    @property
    def master_path(self) -> Path:
        return self.dir / MASTER_LIST

    @property
    def lastupdate_path(self) -> Path:
        return self.dir / LAST_UPDATE

    def _url(self, name: str) -> str:
        return f"{self.gdelt.base_url.rstrip('/')}/{name}"

    def _retrying(self, operation):
        return with_retries(
            operation,
            attempts=self.gdelt.download_attempts,
            backoff_base_s=self.gdelt.backoff_base_s,
            backoff_max_s=self.gdelt.backoff_max_s,
        )

    def _get(self, name: str, cap: int, headers: dict[str, str] | None = None) -> tuple[requests.Response, bytes]:
        """The response to a GET of ``name`` and its decoded body, at most ``cap`` bytes."""

        def op() -> tuple[requests.Response, bytes]:
            with self.session.get(
                self._url(name),
                headers=headers or {},
                stream=True,
                timeout=(self.network.connect_timeout_s, self.network.read_timeout_s),
            ) as resp:
                raise_for_transient(resp)
                return resp, _read_capped(resp, cap)

        return self._retrying(op)

    def refresh(self) -> RefreshResult:
        """Bring the master list and lastupdate up to date. If GDELT is unreachable but a copy
        exists, keep working from the copy and say so (the ledger then shows pending slots)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            result = self._refresh_master()
            last, body = self._get(LAST_UPDATE, MAX_LAST_UPDATE_BYTES)
            last.raise_for_status()
            atomic_write_bytes(self.lastupdate_path, body)
            return result
        except (requests.RequestException, TransientHTTPError, OSError, IndexTooLarge) as exc:
            if not self.master_path.exists():
                raise
            return RefreshResult("cached", 0, self.master_path.stat().st_size, error=f"{type(exc).__name__}: {exc}")

    def _complete_size(self) -> int:
        """Size of the cached list up to its last newline; a crash mid-append can leave a torn
        last line, which we cut off here so the next range request re-fetches it."""
        path = self.master_path
        if not path.exists():
            return 0
        size = path.stat().st_size
        if size == 0:
            return 0
        with open(path, "rb+") as fh:
            fh.seek(max(0, size - 1))
            if fh.read(1) == b"\n":
                return size
            fh.seek(max(0, size - 1_000_000))
            tail = fh.read()
            cut = size - len(tail) + tail.rfind(b"\n") + 1
            fh.truncate(cut)
            return cut

    def _refresh_master(self) -> RefreshResult:
        size = self._complete_size()
        if size >= self.OVERLAP:
            start = size - self.OVERLAP
            resp, body = self._get(MASTER_LIST, MAX_MASTER_LIST_BYTES, headers={"Range": f"bytes={start}-"})
            if resp.status_code == 206 and resp.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                with open(self.master_path, "rb") as fh:
                    fh.seek(start)
                    tail = fh.read(self.OVERLAP)
                if body[: self.OVERLAP] == tail:
                    new = body[self.OVERLAP :]
                    new = new[: new.rfind(b"\n") + 1]  # only whole lines; the rest comes next time
                    if not new:
                        return RefreshResult("unchanged", len(body), size)
                    if size + len(new) > MAX_MASTER_LIST_BYTES:
                        raise IndexTooLarge(f"{resp.url}: would grow past {MAX_MASTER_LIST_BYTES:,} bytes; refused")
                    with open(self.master_path, "ab") as fh:
                        fh.write(new)
                        fh.flush()
                        os.fsync(fh.fileno())
                    return RefreshResult("range", len(body), size + len(new))
            elif resp.status_code == 200:  # the server ignores Range: it sent the whole list
                return self._store_full(body)
            # 416 (the server's list is shorter than ours) or a changed prefix: start over.
        return self._download_full()

    def _store_full(self, body: bytes) -> RefreshResult:
        temp = temp_path_for(self.master_path)
        try:
            temp.write_bytes(body)
            commit_temp(temp, self.master_path)
        finally:
            temp.unlink(missing_ok=True)
        return RefreshResult("full", len(body), len(body))

    def _download_full(self) -> RefreshResult:
        """Stream the whole list (~115 MB for the real GDELT) to a temp file, then swap it in."""

        def op() -> RefreshResult:
            temp = temp_path_for(self.master_path)
            try:
                with self.session.get(
                    self._url(MASTER_LIST),
                    stream=True,
                    timeout=(self.network.connect_timeout_s, self.network.read_timeout_s),
                ) as resp:
                    raise_for_transient(resp)
                    resp.raise_for_status()
                    size = 0
                    with open(temp, "wb") as fh:
                        for chunk in resp.iter_content(_CHUNK_BYTES):
                            size += len(chunk)
                            if size > MAX_MASTER_LIST_BYTES:
                                raise IndexTooLarge(
                                    f"{resp.url}: more than {MAX_MASTER_LIST_BYTES:,} bytes (decoded); refused"
                                )
                            fh.write(chunk)
                commit_temp(temp, self.master_path)
                return RefreshResult("full", size, size)
            finally:
                temp.unlink(missing_ok=True)

        return self._retrying(op)

    def entries_for_day(self, day: date) -> IndexTable:
        """Every listed file of ``day`` (from the master list, plus lastupdate in case the master
        list lags behind it), deduplicated by file name; the last listing of a name wins."""
        tables = []
        if self.master_path.exists():
            region, first_line = day_region(self.master_path.read_bytes(), day)
            tables.append(parse_index(region, first_line))
        if self.lastupdate_path.exists():
            last = parse_index(self.lastupdate_path.read_bytes())
            tables.append(IndexTable(last.entries, last.bad_lines.head(0)))
        if not tables:
            return IndexTable(ENTRY_SCHEMA.to_frame(), BAD_LINE_SCHEMA.to_frame())
        entries = pl.concat([t.entries for t in tables])
        day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        entries = (
            entries.filter(pl.col("slot").is_between(day_start, day_start + timedelta(days=1), closed="left"))
            .unique("name", keep="last", maintain_order=True)
            .sort("slot", "kind")
        )
        return IndexTable(entries, pl.concat([t.bad_lines for t in tables]))
