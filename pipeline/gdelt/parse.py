"""Parse GDELT 2.0 events exports and mentions files into typed polars frames.

The files are TAB-separated, have no header and no quoting, and end each record with ``\\n``
(the GDELT 2.0 Event Codebook, http://data.gdeltproject.org/documentation/GDELT-Event_Codebook-V2.0.pdf).
Every line is accounted for: it ends up either in ``rows`` (typed per ``schema.py``) or in
``rejects`` with its line number, its first :data:`REJECT_LINE_BYTES` bytes, its length, its
sha256 and the reason, so ``rows.height + rejects.height == total_lines`` always; a file of the
wrong format or with implausibly many lines is refused whole (:class:`RefusedFileError`). The line
rules, the reject reasons in order, the refusals and why the clean-file path is fast:
docs/data-layout.md, "Parsing GDELT files". A zip's member is read as a stream, in chunks of whole
lines, each parsed as it comes (:data:`CHUNK_BYTES`; docs/data-layout.md, "Hostile GDELT files").
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import struct
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import polars as pl
import pyarrow as pa

from pipeline.gdelt.archive import (
    DEFAULT_MAX_UNCOMPRESSED_BYTES,
    CorruptArchiveError,
    declared_member_size,
    is_zip,
    stream_gdelt_zip,
)
from pipeline.gdelt.schema import (
    EXPORT_SCHEMA,
    KNOWN_FIELD_COUNTS,
    MENTIONS_SCHEMA,
    REJECTS_SCHEMA,
    SQL_DATE,
    TIMESTAMP,
)

__all__ = [
    "REQUIRED_COLUMNS",
    "GdeltFormatError",
    "ImplausibleLinesError",
    "ParsedFile",
    "RefusedFileError",
    "parse_export",
    "parse_files",
    "parse_mentions",
]

Kind = Literal["export", "mentions"]

# Key columns a row is useless without: the upsert key and the batch timestamp(s) partitioned on.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "export": ("GLOBALEVENTID", "DATEADDED"),
    "mentions": ("GLOBALEVENTID", "EventTimeDate", "MentionTimeDate"),
}

_SCHEMAS: dict[str, pl.Schema] = {"export": EXPORT_SCHEMA, "mentions": MENTIONS_SCHEMA}
_DATE_TYPES = (SQL_DATE, TIMESTAMP)

# The shortest line a row can be: every TAB, the key columns at their narrowest (a 1-digit
# GLOBALEVENTID, 14-digit timestamps) and the newline. A real export line averages ~400 bytes and
# a mentions line ~200 (real files from public repositories, docs/data-layout.md "Why 32 MiB").
SHORTEST_ROW_BYTES: dict[str, int] = {
    "export": 60 + 1 + 14 + 1,  # 60 TABs, GLOBALEVENTID, DATEADDED, \n
    "mentions": 15 + 1 + 14 + 14 + 1,  # 15 TABs, GLOBALEVENTID, EventTimeDate, MentionTimeDate, \n
}
# Below this many lines a file is never refused for its line count: a near-empty real file with a
# few blank lines stays a file of rejects.
_FEW_LINES = 1000
# A rejected line is stored as its first this many bytes, its length and its sha256.
REJECT_LINE_BYTES = 4096
# What the CSV reader is asked for first: numbers typed by the reader (the cheapest way to type
# them), dates and timestamps as text, converted afterwards with the exact-shape checks below.
_READ_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema({n: pl.String if t in _DATE_TYPES else t for n, t in schema.items()})
    for kind, schema in _SCHEMAS.items()
}
# And when the reader refuses a number: every column as text, so the bad value is kept and
# reported instead of failing the whole read.
_TEXT_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema(dict.fromkeys(schema.names(), pl.String)) for kind, schema in _SCHEMAS.items()
}
_NUMERIC_COLUMNS: dict[str, list[tuple[str, pl.DataType]]] = {
    kind: [(n, t) for n, t in schema.items() if t != pl.String and t not in _DATE_TYPES]
    for kind, schema in _SCHEMAS.items()
}

# How the date columns are written, and the exact shape a value must have. chrono alone accepts
# near misses ("2018032" as 2018-03-02, a leading space, second 60 as a leap second), so the value
# must also be all ASCII digits of the right width with seconds below 60; chrono then checks that
# month, day, hour and minute exist.
_DATE_FORMATS: dict[pl.DataType, tuple[str, str]] = {
    SQL_DATE: ("%Y%m%d", r"^[0-9]{8}$"),
    TIMESTAMP: ("%Y%m%d%H%M%S", r"^[0-9]{12}[0-5][0-9]$"),
}


class RefusedFileError(ValueError):
    """The file as a whole cannot be parsed as the kind asked for; none of its lines is kept."""


class ImplausibleLinesError(RefusedFileError):
    """The file has far more lines than GDELT rows of its size could make (see
    :data:`SHORTEST_ROW_BYTES`)."""


class GdeltFormatError(RefusedFileError):
    """The file is not the GDELT format it was parsed as (wrong feed, wrong version)."""

    def __init__(self, message: str, *, expected: int, detected: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.detected = detected


# eq=False: the generated __eq__ would compare DataFrames with ``==``, which is element-wise.
@dataclass(frozen=True, eq=False)
class ParsedFile:
    """One parsed file: typed rows, rejected lines, and the line count they add up to."""

    kind: Kind
    source: str  # where the bytes came from, as given by the caller; copied into rejects.file
    rows: pl.DataFrame  # exactly EXPORT_SCHEMA or MENTIONS_SCHEMA
    rejects: pl.DataFrame  # REJECTS_SCHEMA, sorted by line_number
    total_lines: int

    def __post_init__(self) -> None:
        if self.rows.height + self.rejects.height != self.total_lines:
            raise ValueError(
                f"{self.source}: {self.rows.height} rows + {self.rejects.height} rejects != {self.total_lines} lines"
            )


def parse_export(data: bytes, source: str = "<bytes>") -> ParsedFile:
    """Parse a GDELT 2.0 events export (61 fields), given as the ``.zip`` or the CSV bytes.

    ``data`` is unzipped when it starts with a zip signature or ``source`` ends in ``.zip``.
    Raises :class:`GdeltFormatError` for another format, ``CorruptArchiveError`` for a bad zip.
    """
    return _parse(data, source, "export")


def parse_mentions(data: bytes, source: str = "<bytes>") -> ParsedFile:
    """Parse a GDELT 2.0 mentions file (16 fields); otherwise as :func:`parse_export`."""
    return _parse(data, source, "mentions")


def default_workers() -> int:
    """Threads :func:`parse_files` uses by default: one per core."""
    return os.cpu_count() or 2


# Files parsed together by parse_files: read with one ``pl.read_csv`` and converted with one set
# of expressions, up to this many files or unzipped bytes (a 15-minute export is 0.5 to 3 MB
# unzipped).
BATCH_FILES = 16
BATCH_BYTES = 16 * 2**20
# A file is parsed in chunks of whole lines of about this many unzipped bytes, each read with one
# ``pl.read_csv`` once it is in hand, so parsing holds a few chunks of a file, not the file
# (reading holds several times the bytes it reads: see :func:`in_flight_bytes`). 15-minute files
# are smaller: each is one chunk. The size was chosen by measurement (docs/data-layout.md,
# "Hostile GDELT files").
CHUNK_BYTES = 4 * 2**20


def in_flight_bytes(max_member_bytes: int) -> int:
    """Unzipped bytes of the batches :func:`parse_files` may have handed to its threads and not
    yet yielded, whatever the number of cores (the first batch is always let through).

    Reading holds several times the bytes it reads (a column of 16-byte string views per field:
    ~1 KB per export line, ~25x the bytes of the shortest rows), and the rows kept of a file of
    the shortest rows are several times its bytes too; a big file is read a chunk at a time
    (:data:`CHUNK_BYTES`) but its rows are kept whole. So this, not the thread count, is what
    bounds its memory. One and a half times the larger of a batch and the member cap: two files at
    the cap are never parsed at once, while three batches of ordinary files are.
    """
    return max(BATCH_BYTES, max_member_bytes) + max_member_bytes // 2


def parse_files(
    items: Iterable[tuple[bytes, str]],
    kind: Kind,
    workers: int | None = None,
    *,
    max_member_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    refused: Literal["raise", "yield"] = "raise",
) -> Iterator[ParsedFile | RefusedFileError | CorruptArchiveError]:
    """Parse ``(data, source)`` pairs of one ``kind``; yield the :class:`ParsedFile` of each, in
    the order of ``items``. Each file gives exactly what ``parse_export`` / ``parse_mentions``
    gives for it alone.

    The files are parsed in batches (:data:`BATCH_FILES`, :data:`BATCH_BYTES`): each batch is
    read with one ``pl.read_csv`` call and converted with one set of expressions, which costs
    far less than file by file for 15-minute files. ``workers`` batches are parsed at once on
    as many threads (default: one per core); polars runs without the GIL, so one batch's reading
    overlaps another's counting and splitting. ``items`` is consumed lazily, holding at most
    ``workers + 1`` batches and, past the first, :func:`in_flight_bytes` of unzipped bytes
    (counted from each zip's declared size; a member is refused once it inflates past
    ``max_member_bytes`` or its declared size, so that count holds). A member is inflated as a
    stream and read in chunks of whole lines as they come (:func:`_parse_batch`), never held whole.

    A file that cannot be parsed (a bad zip, one past the cap, the wrong format, implausibly many
    lines) raises its exception when its turn comes, after every file before it has been yielded;
    with ``refused="yield"`` the exception is yielded in the file's place instead and the files
    after it are parsed too.
    """
    workers = workers or default_workers()
    batches = _batches(items, max_member_bytes)
    parse = functools.partial(_parse_batch, kind=kind, cap=max_member_bytes)
    budget = in_flight_bytes(max_member_bytes)
    if workers == 1:
        for batch, _ in batches:
            yield from _unwrap(parse(batch), refused)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gdelt-parse")
    ahead: deque[tuple[Future[list[ParsedFile | Exception]], int]] = deque()
    in_flight = 0
    try:
        while True:
            try:
                batch, size = next(batches, (None, 0))
            except Exception:
                # Getting the next file failed: the files before it still come first.
                while ahead:
                    yield from _unwrap(ahead.popleft()[0].result(), refused)
                raise
            if batch is None:
                break
            while ahead and (len(ahead) > workers or in_flight + size > budget):
                done, done_size = ahead.popleft()
                in_flight -= done_size
                yield from _unwrap(done.result(), refused)
            ahead.append((pool.submit(parse, batch), size))
            in_flight += size
        while ahead:
            yield from _unwrap(ahead.popleft()[0].result(), refused)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _unzipped_size(data: bytes, source: str, cap: int) -> int:
    """What ``data`` comes to once unzipped, as far as memory goes: a zip's declared member size
    (no more than ``cap``, past which it is refused), else its own length."""
    if is_zip(data) or source.lower().endswith(".zip"):
        declared = declared_member_size(data)
        return len(data) if declared is None else min(declared, cap)
    return len(data)


def _batches(items: Iterable[tuple[bytes, str]], cap: int) -> Iterator[tuple[list[tuple[bytes, str]], int]]:
    """``items`` in batches, each with its unzipped size; when getting an item fails, the items
    before it are still yielded first, then the exception raised."""
    batch: list[tuple[bytes, str]] = []
    size = 0
    try:
        for item in items:
            item_size = _unzipped_size(*item, cap)
            if batch and item_size >= BATCH_BYTES // 2:
                # A big file goes alone: joined to others it would be copied and read with them.
                yield batch, size
                batch, size = [], 0
            batch.append(item)
            size += item_size
            if len(batch) >= BATCH_FILES or size >= BATCH_BYTES:
                yield batch, size
                batch, size = [], 0
    except Exception:
        if batch:
            yield batch, size
        raise
    if batch:
        yield batch, size


def _unwrap(results: list[ParsedFile | Exception], refused: str = "raise") -> Iterator[ParsedFile | Exception]:
    for result in results:
        if isinstance(result, (RefusedFileError, CorruptArchiveError)) and refused == "yield":
            yield result
        elif isinstance(result, Exception):
            raise result
        else:
            yield result


def _parse(data: bytes, source: str, kind: Kind) -> ParsedFile:
    (result,) = _unwrap(_parse_batch([(data, source)], kind, DEFAULT_MAX_UNCOMPRESSED_BYTES))
    return result


_BOM = b"\xef\xbb\xbf"


@dataclass
class _Plan:
    """One file, ready to be read: what goes to the CSV reader, and how its rows map to lines."""

    source: str
    data: bytes  # the CSV, unzipped
    total_lines: int
    csv: bytes  # what the reader gets: ``data``, or only its well-formed lines
    n_rows: int  # lines in ``csv``
    found: list[tuple[int, str]]  # (line_number, reason) of the lines left out of ``csv``
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # (start, end) of some lines, by number
    # Where each line of ``data`` ends (see :func:`_line_ends`), once a line had to be looked at.
    ends: list[int] | None = None
    by_line: bool = False  # whether ``csv`` holds the lines found well-formed one by one
    first_line: int = 0  # lines of the file before ``data`` (``data`` is one of its chunks)
    # Whether a byte order mark starting ``csv`` is data: lines of the file before it went to the
    # reader (see :func:`_join`).
    bom_is_data: bool = False

    def raw_line(self, number: int) -> memoryview:
        """The bytes of line ``number``, as a view into ``data`` (no copy)."""
        if number in self.spans:
            start, end = self.spans[number]
        else:
            if self.ends is None:
                self.ends = _line_ends(_byte_view(self.data), self.data)
            start, end = _line_start(self.ends, number - 1), self.ends[number - 1]
        return memoryview(self.data)[start:end]


def _plan(data: bytes, source: str, kind: str, first_line: int) -> _Plan:
    """What of a chunk of whole lines of a file (the lines after its first ``first_line``) goes to
    the reader: all of it if it passes the clean-file proof so far, else only its well-formed lines.

    The proof: a clean file holds ``fields - 1`` TABs per line, so its TAB total gives its line
    count. The reader (:func:`_read`) raises on any line with more fields than the schema, so once
    it succeeds no line has more than ``fields - 1`` TABs, and the file has at least as many lines
    as its TABs make. The reader gives one row per line (a blank line too), so when its row count
    is the one the TABs make, there are exactly that many lines, none of them short. Undecodable
    bytes would make the reader raise too; they are looked for first, so that one such line does
    not fail the read of a whole batch of files.
    """
    # A real 15-minute file can be near-empty (GDELT's index lists a 401-byte export in February 2015,
    # during an outage); an empty one makes no line and goes to the reader as nothing.
    tabs = _count_byte(data, b"\t")
    n_lines, odd = divmod(tabs, len(_SCHEMAS[kind]) - 1)
    plan = _Plan(source, data, n_lines, data, n_lines, [], first_line=first_line)
    # Bytes that make no whole line cannot be a clean file. And the reader lets one line through
    # with a field too many: the last one, when no \n ends it and the extra field is empty.
    unended = data.rfind(b"\n") + 1 if not data.endswith(b"\n") else len(data)
    if odd or (data and not n_lines) or data.count(b"\t", unended) >= len(_SCHEMAS[kind]):
        return _line_by_line(plan, kind)
    if not _is_utf8(data):
        return _without_undecodable(plan, kind, tabs)
    return plan


def _most_lines(size: int, kind: str) -> int:
    """The most lines a ``kind`` file of ``size`` bytes may have: as many as rows of the shortest
    possible length would make, and never fewer than a few."""
    return max(_FEW_LINES, size // SHORTEST_ROW_BYTES[kind])


def _check_line_count(lines: int, size: int, source: str, kind: str) -> None:
    """Raise :class:`ImplausibleLinesError` when a file of ``size`` bytes has ``lines`` lines,
    more than :func:`_most_lines`."""
    if lines > _most_lines(size, kind):
        raise ImplausibleLinesError(
            f"{source}: {lines:,} lines in {size:,} bytes, {size / lines:.1f} bytes per line on average; "
            f"a GDELT 2.0 {kind} row is at least {SHORTEST_ROW_BYTES[kind]} bytes, so this is not a {kind} file"
        )


def _count_lines(data: bytes) -> int:
    return _count_byte(data, b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _count_byte(data: bytes | memoryview, byte: bytes) -> int:
    """How many times ``byte`` occurs in ``data``.

    polars compares a byte array with SIMD and counts the bit mask: about ten times less CPU than
    ``bytes.count`` (which holds the GIL for the whole scan). The array is a zero-copy view of
    ``data`` through pyarrow.
    """
    return _byte_view(data).eq(ord(byte)).sum()


def _byte_view(data: bytes | memoryview) -> pl.Series:
    """``data`` as a UInt8 series, without a copy (through pyarrow)."""
    return pl.from_arrow(pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)]))


def _line_ends(view: pl.Series, data: bytes) -> list[int]:
    """Where each line of ``data`` (``view``: :func:`_byte_view`) ends: the offset of its ``\\n``,
    or ``len(data)`` for a last line without one."""
    ends = view.eq(ord("\n")).arg_true().to_list()
    if data and not data.endswith(b"\n"):
        ends.append(len(data))
    return ends


def _line_start(ends: list[int], index: int) -> int:
    """Offset of the first byte of the line at ``index`` (0-based)."""
    return ends[index - 1] + 1 if index else 0


def _line_tabs(view: pl.Series, data: bytes) -> pl.Series:
    """TABs per line of ``data`` (``view``: :func:`_byte_view`), as Int64.

    Only the TABs and ``\\n`` are kept, in order (polars filters a byte mask far faster than it
    lists positions); a line's TABs are then the distance between its ``\\n`` and the previous
    one among them, less one.
    """
    marks = view.filter(view.eq(ord("\t")) | view.eq(ord("\n")))
    newlines = marks.eq(ord("\n")).arg_true().cast(pl.Int64)
    if data and not data.endswith(b"\n"):  # the last line ends where the marks do
        newlines = pl.concat([newlines, pl.Series([marks.len()], dtype=pl.Int64)])
    return newlines - newlines.shift(1, fill_value=-1) - 1


def _without_undecodable(plan: _Plan, kind: str, tabs: int) -> _Plan:
    """``plan`` (a whole file, ``tabs`` TABs) without its undecodable lines.

    When the TABs of the other lines still make whole lines, the same proof holds for them, and
    the file need not be split into lines: the usual damage in transit is a few flipped bytes.
    """
    data = plan.data
    undecodable = _undecodable_lines(data)
    tabs -= sum(data.count(b"\t", start, end) for _, start, end in undecodable)
    rest, odd = divmod(tabs, len(_SCHEMAS[kind]) - 1)
    if odd:
        return _line_by_line(plan, kind, undecodable)
    return dataclasses.replace(
        plan,
        total_lines=rest + len(undecodable),
        csv=_cut_out(data, [(start, end) for _, start, end in undecodable]),
        n_rows=rest,
        found=[(number, "invalid_utf8") for number, _, _ in undecodable],
        spans={number: (start, end) for number, start, end in undecodable},
    )


def _line_by_line(plan: _Plan, kind: str, undecodable: list[tuple[int, int, int]] | None = None) -> _Plan:
    """``plan`` with its malformed lines found and left out of what the reader gets."""
    data = plan.data
    view = _byte_view(data)
    ends = _line_ends(view, data)
    if undecodable is None:
        undecodable = [] if _is_utf8(data) else _undecodable_lines(data)
    found = _line_rejects(data, ends, _line_tabs(view, data), kind, [number for number, _, _ in undecodable])
    spans = [(_line_start(ends, number - 1), ends[number - 1]) for number, _ in found]
    return dataclasses.replace(
        plan,
        total_lines=len(ends),
        csv=_cut_out(data, spans),
        n_rows=len(ends) - len(found),
        found=found,
        spans={},
        ends=ends,
        by_line=True,
    )


def _cut_out(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    """``data`` without the lines at ``spans`` (``(start, end)``, sorted, ``end`` at the line's
    ``\\n`` or at the end of ``data``), each with its ``\\n``."""
    view = memoryview(data)
    kept, pos = [], 0
    for start, end in spans:
        kept.append(view[pos:start])
        pos = end + 1
    kept.append(view[pos:])
    return b"".join(kept)


@dataclass(eq=False)
class _File:
    """One file of a batch while its chunks are parsed."""

    source: str
    parts: list[ParsedFile] = field(default_factory=list)  # one per chunk read so far, in order
    votes: Counter[int] = field(default_factory=Counter)  # see :func:`_votes`
    failed: Exception | None = None

    def add(self, part: ParsedFile | Exception, kind: str) -> None:
        if isinstance(part, Exception):
            self.failed = self.failed or part
        else:
            self.parts.append(part)
            self.votes.update(_votes(part, kind))

    def outcome(self, kind: Kind) -> ParsedFile | Exception:
        if isinstance(self.failed, (CorruptArchiveError, ImplausibleLinesError)):
            return self.failed
        try:
            _check_format({n: c for n, c in self.votes.items() if c}, kind, len(_SCHEMAS[kind]), self.source)
        except GdeltFormatError as exc:
            return exc
        if self.failed:
            return self.failed
        if len(self.parts) == 1:
            return self.parts[0]
        return ParsedFile(
            kind,
            self.source,
            pl.concat([part.rows for part in self.parts]),
            pl.concat([part.rejects for part in self.parts]),
            sum(part.total_lines for part in self.parts),
        )


def _parse_batch(items: list[tuple[bytes, str]], kind: Kind, cap: int) -> list[ParsedFile | Exception]:
    """Parse several files of one kind at once (each member up to ``cap`` bytes unzipped); a file
    that cannot be parsed gets its exception in its place.

    Each file comes as chunks of whole lines (:func:`_chunk_plans`). A chunk of :data:`CHUNK_BYTES` or
    more is read on its own as soon as it comes, so a big file is parsed a chunk at a time; the
    smaller ones (a whole 15-minute file, the last chunk of a big one) are read together at the
    end. The checks that need the whole file (its line count, its format) are made on what its
    chunks add up to.
    """
    files: list[_File] = []
    waiting: list[tuple[_File, _Plan]] = []
    for data, source in items:
        file = _File(source)
        files.append(file)
        try:
            for plan in _chunk_plans(data, source, kind, cap, file):
                if len(plan.data) >= CHUNK_BYTES:
                    _read_into([(file, plan)], kind)
                else:
                    waiting.append((file, plan))
        except (CorruptArchiveError, RefusedFileError) as exc:
            file.failed = exc
    _read_into(waiting, kind)
    return [file.outcome(kind) for file in files]


def _chunk_plans(data: bytes, source: str, kind: Kind, cap: int, file: _File) -> Iterator[_Plan]:
    """The plan of each chunk of ``data`` (a zip's member up to ``cap`` bytes, or the CSV itself),
    as :func:`_line_chunks` or :func:`_byte_chunks` cuts it; raises :class:`ImplausibleLinesError` after the last chunk when
    the file has more lines than :func:`_most_lines` allows.

    Once the lines counted so far are more than a file of the largest size it can have may hold,
    it will be refused whatever comes next: its parsed chunks are dropped and the rest is only
    counted, so the cost per line stays that of a plausible file.
    """
    # A source named *.zip must be one: text saved under a zip's name (github.com/epournaras/DIAS-GDELT
    # has a lastupdate.txt saved as 20180326191500.export.CSV.zip) is a broken download, to be
    # reported as such rather than parsed as a CSV of the wrong format.
    if is_zip(data) or source.lower().endswith(".zip"):
        chunks, largest = _line_chunks(stream_gdelt_zip(data, max_uncompressed_bytes=cap), CHUNK_BYTES), cap
    else:
        chunks, largest = _byte_chunks(data, CHUNK_BYTES), len(data)
    most = _most_lines(largest, kind)
    lines = size = 0
    for chunk in chunks:
        first_line = lines
        lines += _count_lines(chunk)
        size += len(chunk)
        if lines <= most:
            yield _plan(chunk, source, kind, first_line)
        else:
            file.parts.clear()
    _check_line_count(lines, size, source, kind)


def _line_chunks(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The bytes of ``pieces`` one after the other, cut into chunks of whole lines: each but the
    last ends with a ``\\n`` and holds at least ``size`` bytes (more when a line runs past that
    point, up to the last line end of the piece that got there); the last holds the rest. At
    least one chunk, ``b""`` for no bytes."""
    out, cut_any = io.BytesIO(), False
    for piece in pieces:
        cut = piece.rfind(b"\n") + 1
        if not cut or out.tell() + cut < size:
            out.write(piece)
            continue
        out.write(memoryview(piece)[:cut])
        yield out.getvalue()  # BytesIO hands its buffer over without a copy
        cut_any = True
        out = io.BytesIO()
        out.write(memoryview(piece)[cut:])
    if out.tell() or not cut_any:
        yield out.getvalue()


def _byte_chunks(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in chunks as :func:`_line_chunks` cuts them (``data`` itself when it is one)."""
    start = 0
    while len(data) - start > size and (cut := data.find(b"\n", start + size - 1) + 1):
        yield data[start:cut]
        start = cut
    if start < len(data) or not start:
        yield data[start:] if start else data


def _read_into(plans: list[tuple[_File, _Plan]], kind: Kind) -> None:
    """Read ``plans`` together and add each result to its file."""
    for file, plan in plans:
        plan.bom_is_data = file.votes[len(_SCHEMAS[kind])] > 0
    for (file, _), part in zip(plans, _parse_plans([plan for _, plan in plans], kind)):
        file.add(part, kind)


def _parse_plans(plans: list[_Plan], kind: Kind) -> list[ParsedFile | Exception]:
    if not plans:
        return []
    read = _read(_join(plans), kind, sum(plan.n_rows for plan in plans))
    if read is None:
        # A line the TAB total did not show: one too long balanced by one too short, or a blank
        # line (its file has a row more than its TABs make). Find the file, and its lines.
        if len(plans) > 1:
            return [parsed for plan in plans for parsed in _parse_plans([plan], kind)]
        (plan,) = plans
        if plan.by_line:
            return [
                RuntimeError(
                    f"{plan.source}: {plan.n_rows} well-formed lines could not be read back as "
                    "as many rows; the line splitter and the CSV reader disagree"
                )
            ]
        return _parse_plans([_line_by_line(plan, kind)], kind)

    fields, numbers_typed = read
    rows = _convert(fields, numbers_typed, kind)
    reasons = _value_reasons(fields, rows, REQUIRED_COLUMNS[kind])
    parsed: list[ParsedFile | Exception] = []
    offset = 0
    for plan in plans:
        file_rows = rows.slice(offset, plan.n_rows)
        found = plan.found
        if reasons is not None:
            file_reasons = reasons.slice(offset, plan.n_rows)
            failed = file_reasons.is_not_null()
            if failed.any():
                positions = failed.arg_true().to_list()
                numbers = _line_numbers(positions, [number for number, _ in found])
                found = sorted([*found, *zip(numbers, file_reasons.filter(failed).to_list())])
                file_rows = file_rows.filter(~failed)
        offset += plan.n_rows
        rejects = _shape_rejects(plan, found)
        parsed.append(ParsedFile(kind, plan.source, file_rows, rejects, plan.total_lines))
    return parsed


def _join(plans: list[_Plan]) -> bytes:
    """What the reader gets for ``plans``: their CSVs one after the other.

    Each is read as polars would read its whole file: it ends with a ``\\n`` (so no line runs
    into the next file's), and a UTF-8 byte order mark starting it is dropped (polars drops one
    by itself, only at the start of what it reads) unless lines of its file before it went to the
    reader (the mark is then inside what polars reads of the file, and kept as data: an extra mark
    goes before it when it starts what the reader gets).
    """
    plans = [plan for plan in plans if plan.csv]
    if len(plans) == 1 and not (plans[0].bom_is_data and plans[0].csv.startswith(_BOM)):
        return plans[0].csv
    pieces: list[bytes] = []
    for plan in plans:
        csv = plan.csv
        if pieces and not pieces[-1].endswith(b"\n"):
            pieces.append(b"\n")
        if csv.startswith(_BOM) and not pieces and plan.bom_is_data:
            pieces.append(_BOM)
        elif csv.startswith(_BOM) and pieces and not plan.bom_is_data:
            csv = csv[len(_BOM) :]
        pieces.append(csv)
    return b"".join(pieces)


def _csv(csv: bytes, schema: pl.Schema) -> pl.DataFrame:
    """Split ``csv`` into the columns of ``schema``; empty fields become null.

    polars drops one ``\\r`` before each ``\\n`` (and at the end of the buffer) itself.
    """
    return pl.read_csv(
        csv,
        has_header=False,
        separator="\t",
        quote_char=None,  # GDELT never quotes; a '"' is data
        schema=schema,
    )


def _read(csv: bytes, kind: str, n_lines: int) -> tuple[pl.DataFrame, bool] | None:
    """The ``n_lines`` lines of ``csv`` as one frame, and whether its numbers are typed yet; or
    None when a line is not well-formed: more fields than the schema, undecodable, or the row
    count is off.

    The numbers come typed by the reader, the dates and timestamps as text (for
    :func:`_convert`). When the reader refuses a number, the file is read again as text with the
    numeric columns prepared by :func:`_number_text`; their casts then find the bad values line
    by line.
    """
    if not csv or not n_lines:
        # polars reads a lone byte order mark as no row at all, but it is a line.
        return (pl.DataFrame(schema=_READ_SCHEMAS[kind]), True) if not csv and not n_lines else None
    typed = True
    try:
        frame = _csv(csv, _READ_SCHEMAS[kind])
    except pl.exceptions.PolarsError:
        typed = False
        # A number the reader refused, a line with too many fields, or bytes that are not UTF-8
        # (polars validates strings). Checking the UTF-8 first spares a second read of a file
        # whose trouble is there.
        if not _is_utf8(csv):
            return None
        try:
            frame = _csv(csv, _TEXT_SCHEMAS[kind]).with_columns(_number_text(kind))
        except pl.exceptions.PolarsError:
            return None
    return (frame, typed) if frame.height == n_lines else None


def _is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8.

    pyarrow validates a zero-copy view of it as one string: faster than polars, which must copy
    it into a Series first, and three times faster than Python's decode. All three agree on what
    UTF-8 is (no surrogates, no overlong forms; checked on 400,000 byte strings).
    """
    # The offsets are packed by hand: pa.array() on a Python list would import pandas (48 MiB).
    offsets = pa.py_buffer(struct.pack("<2q", 0, len(data)))
    try:
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


@functools.cache
def _number_text(kind: str) -> list[pl.Expr]:
    """The numeric text columns as polars' CSV number reader sees them: leading spaces skipped,
    nothing left is an empty field (null).

    The reader, given a number column, parses the field; if that fails and the field starts with
    a space, it parses it again without the leading spaces, and an empty rest is null. Applying
    the same to the text before the cast gives the same value or the same refusal for every
    field (checked against the reader on thousands of near-number strings while writing this),
    so a line reads the same whether or not another line of its file held a bad number.
    """
    exprs = []
    for name, _ in _NUMERIC_COLUMNS[kind]:
        stripped = pl.col(name).str.strip_chars_start(" ")
        exprs.append(pl.when(stripped != "").then(stripped).alias(name))
    return exprs


# From text to a column's type: numbers cast, dates parsed (with or without the shape check).
def _number(name: str, dtype: pl.DataType) -> pl.Expr:
    return pl.col(name).cast(dtype, strict=False)


def _date(name: str, dtype: pl.DataType, *, check_shape: bool) -> pl.Expr:
    column = pl.col(name)
    fmt, shape = _DATE_FORMATS[dtype]
    if dtype == SQL_DATE:
        parsed = column.str.to_date(fmt, strict=False)
    else:
        parsed = column.str.to_datetime(fmt, time_unit=dtype.time_unit, time_zone=dtype.time_zone, strict=False)
    return pl.when(column.str.contains(shape)).then(parsed) if check_shape else parsed


@functools.cache
def _conversions(kind: str, numbers_typed: bool, checked: frozenset[str]) -> list[pl.Expr]:
    """The expressions that take a frame from :func:`_read` to ``kind``'s schema, with the shape
    check on the date columns in ``checked``. Built once per case: with 61 columns, building them
    costs as much as running them on a 15-minute file."""
    exprs = []
    for name, dtype in _SCHEMAS[kind].items():
        if dtype in _DATE_TYPES:
            exprs.append(_date(name, dtype, check_shape=name in checked).alias(name))
        elif dtype != pl.String and not numbers_typed:
            exprs.append(_number(name, dtype).alias(name))
    return exprs


@functools.cache
def _shape_flags(kind: str) -> tuple[list[str], list[pl.Expr]]:
    """Per date column, a flag: every distinct value has the exact shape."""
    names = [name for name, dtype in _SCHEMAS[kind].items() if dtype in _DATE_TYPES]
    flags = [
        pl.col(name).unique().str.contains(_DATE_FORMATS[_SCHEMAS[kind][name]][1]).all().alias(f"shape:{name}")
        for name in names
    ]
    return names, flags


def _convert(read: pl.DataFrame, numbers_typed: bool, kind: str) -> pl.DataFrame:
    """``read`` converted to ``kind``'s schema; a value that does not fit becomes null.

    chrono's near misses are rare, and a file holds a handful of distinct dates (usually a single
    DATEADDED), so the dates are parsed without the shape check while a flag per column tells
    whether every distinct value has the shape; only a column where one does not is parsed again
    with the check, row by row.
    """
    names, flags = _shape_flags(kind)
    rows = read.with_columns(*_conversions(kind, numbers_typed, frozenset()), *flags)
    if not rows.height:  # no row to hold the flags, and no date to check
        return rows[:, : read.width]
    shaped = [rows.get_column(flag.meta.output_name())[0] for flag in flags]
    odd = frozenset(name for name, ok in zip(names, shaped) if not ok)
    if odd:
        return read.with_columns(_conversions(kind, numbers_typed, odd))
    return rows[:, : read.width]


def _line_numbers(positions: list[int], skipped: list[int]) -> list[int]:
    """1-based line numbers of the rows at ``positions`` (sorted) among the lines that were left
    after leaving out the (sorted) line numbers ``skipped``."""
    numbers, gone = [], 0
    for position in positions:
        number = position + 1 + gone
        while gone < len(skipped) and skipped[gone] <= number:
            gone += 1
            number += 1
        numbers.append(number)
    return numbers


def _undecodable_lines(data: bytes) -> list[tuple[int, int, int]]:
    """``(line_number, start, end)`` of each line that is not valid UTF-8 (``end`` excludes the
    ``\\n``).

    The loop runs once per undecodable line, not per line: each pass decodes up to the next
    error, so the buffer is decoded about once. ``\\n`` never occurs inside a multi-byte UTF-8
    sequence, so cutting at it is always safe.
    """
    view = memoryview(data)
    found: list[tuple[int, int, int]] = []
    pos = 0
    newlines_before = 0  # newlines in data[:counted]
    counted = 0
    while True:
        try:
            str(view[pos:], "utf-8")
            return found
        except UnicodeDecodeError as exc:
            at = pos + exc.start
            start = max(data.rfind(b"\n", pos, at) + 1, pos)
            end = data.find(b"\n", at)
            end = len(data) if end == -1 else end
            newlines_before += _count_byte(view[counted:start], b"\n")
            counted = start
            found.append((newlines_before + 1, start, end))
            pos = end


def _line_rejects(
    data: bytes, ends: list[int], tabs: pl.Series, kind: str, undecodable: list[int]
) -> list[tuple[int, str]]:
    """``(line_number, reason)`` of every line that is not well-formed, in line order: an
    undecodable line is ``invalid_utf8``, a blank one ``empty_line``, another with the wrong
    number of TABs ``field_count:N`` (what :func:`_votes` counts)."""
    expected = len(_SCHEMAS[kind])
    wrong = (tabs != expected - 1).arg_true()
    wrong_tabs = dict(zip(wrong.to_list(), tabs.gather(wrong).to_list()))
    undecodable_at = {number - 1 for number in undecodable}
    found = []
    for at in sorted(undecodable_at.union(wrong_tabs)):
        if at in undecodable_at:
            reason = "invalid_utf8"
        elif data[_line_start(ends, at) : ends[at]] in (b"", b"\r"):
            reason = "empty_line"
        else:
            reason = f"field_count:{wrong_tabs[at] + 1}"
        found.append((at + 1, reason))
    return found


def _votes(part: ParsedFile, kind: str) -> Counter[int]:
    """Lines of ``part`` by field count, among the voters for the file's format: lines that were
    decodable and not blank. Every line the reader got has the expected count (it refuses more
    fields, and the TAB count proves there are no fewer); the others are the ``field_count``
    rejects."""
    votes: Counter[int] = Counter()
    others = 0
    if part.rejects.height:
        for reason, count in part.rejects.get_column("reason").value_counts().iter_rows():
            if reason.startswith("field_count:"):
                votes[int(reason.removeprefix("field_count:"))] += count
            if reason.startswith("field_count:") or reason in ("invalid_utf8", "empty_line"):
                others += count
    votes[len(_SCHEMAS[kind])] += part.total_lines - others
    return votes


def _check_format(votes: dict[int, int], kind: str, expected: int, source: str) -> None:
    """Raise :class:`GdeltFormatError` unless ``expected`` is strictly the most common field
    count among the voters (``votes``: field count -> lines, see :func:`_votes`).

    Only decodable, non-blank lines vote, so a handful of broken lines cannot make a file look
    like another format, and a file of nothing but broken lines is left to the rejects."""
    expected_votes = votes.get(expected, 0)
    if 2 * expected_votes > sum(votes.values()):  # a majority: the common case
        return
    ranked = sorted(votes.items(), key=lambda vote: (-vote[1], vote[0]))
    rivals = [(n, c) for n, c in ranked if n != expected]
    if not rivals:
        return
    detected, detected_votes = rivals[0]
    if detected_votes < expected_votes:
        return
    what = KNOWN_FIELD_COUNTS.get(detected, f"no known GDELT format ({detected} fields per line)")
    counts = ", ".join(f"{n} fields ×{c:,}" for n, c in ranked)
    raise GdeltFormatError(
        f"{source}: this is {what}, not {KNOWN_FIELD_COUNTS[expected]} ({expected} columns) "
        f"as expected by parse_{kind} (lines by field count: {counts})",
        expected=expected,
        detected=detected,
    )


def _value_reasons(fields: pl.DataFrame, rows: pl.DataFrame, required: tuple[str, ...]) -> pl.Series | None:
    """Per row, ``bad_value:…`` / ``missing_value:…`` or null; None when every row is fine.

    A conversion never turns null into a value, so equal null counts per column prove that
    nothing failed. That costs nothing, and the row-level search only runs for the columns that
    differ.
    """
    before, after = fields.null_count().row(0), rows.null_count().row(0)
    failing = [name for name, was, now in zip(rows.columns, before, after) if now != was]
    missing = [name for name in required if rows[name].null_count()]
    if not failing and not missing:
        return None
    flags = pl.DataFrame(
        [(fields[name].is_not_null() & rows[name].is_null()).alias(f"bad_value:{name}") for name in failing]
        + [rows[name].is_null().alias(f"missing_value:{name}") for name in missing]
    )
    # Built from the last check to the first, so a bad value wins over a missing key.
    reason = pl.lit(None, pl.String)
    for label, names in (("missing_value", missing), ("bad_value", failing)):
        if names:
            columns = [f"{label}:{name}" for name in names]
            listed = pl.concat_str(
                [pl.when(pl.col(column)).then(pl.lit(name)) for column, name in zip(columns, names)],
                separator=",",
                ignore_nulls=True,
            )
            reason = pl.when(pl.any_horizontal(columns)).then(f"{label}:" + listed).otherwise(reason)
    return flags.select(reason.alias("reason")).to_series()


_NO_REJECTS = pl.DataFrame(schema=REJECTS_SCHEMA)


def _shape_rejects(plan: _Plan, found: list[tuple[int, str]]) -> pl.DataFrame:
    """REJECTS_SCHEMA rows for ``found``, each with its line's first :data:`REJECT_LINE_BYTES`
    bytes exactly as received, its length and its sha256."""
    if not found:
        return _NO_REJECTS.clone()  # far cheaper than building an empty frame from the schema
    numbers, reasons = zip(*found)
    lines = [plan.raw_line(number) for number in numbers]
    return pl.DataFrame(
        {
            "file": [plan.source] * len(found),
            "line_number": [plan.first_line + number for number in numbers],
            "reason": reasons,
            "raw_line": [bytes(line[:REJECT_LINE_BYTES]) for line in lines],
            "raw_length": [len(line) for line in lines],
            "raw_sha256": [hashlib.sha256(line).hexdigest() for line in lines],
        },
        schema=REJECTS_SCHEMA,
    )
