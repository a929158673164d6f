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

import functools
import hashlib
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import polars as pl

from pipeline.gdelt.archive import (
    DEFAULT_MAX_UNCOMPRESSED_BYTES,
    CorruptArchiveError,
    declared_member_size,
    is_zip,
    stream_gdelt_zip,
)
from pipeline.gdelt.convert import convert_frame, read_csv_lines, value_reasons
from pipeline.gdelt.lines import (
    ReadPlan,
    byte_chunks,
    count_lines,
    joined_csv,
    line_by_line,
    line_chunks,
    line_numbers,
    plan_read,
)
from pipeline.gdelt.refusals import (
    GdeltFormatError,
    ImplausibleLinesError,
    RefusedFileError,
    check_format,
    check_line_count,
    most_lines,
)
from pipeline.gdelt.schema import REJECTS_SCHEMA, SCHEMAS

__all__ = [
    "REQUIRED_COLUMNS",
    "ParsedFile",
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


# A rejected line is stored as its first this many bytes, its length and its sha256.
REJECT_LINE_BYTES = 4096


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
            check_format({n: c for n, c in self.votes.items() if c}, kind, len(SCHEMAS[kind]), self.source)
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
    waiting: list[tuple[_File, ReadPlan]] = []
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


def _chunk_plans(data: bytes, source: str, kind: Kind, cap: int, file: _File) -> Iterator[ReadPlan]:
    """The plan of each chunk of ``data`` (a zip's member up to ``cap`` bytes, or the CSV itself),
    as :func:`line_chunks` or :func:`byte_chunks` cuts it; raises :class:`ImplausibleLinesError` after the last chunk when
    the file has more lines than :func:`most_lines` allows.

    Once the lines counted so far are more than a file of the largest size it can have may hold,
    it will be refused whatever comes next: its parsed chunks are dropped and the rest is only
    counted, so the cost per line stays that of a plausible file.
    """
    # A source named *.zip must be one: text saved under a zip's name (github.com/epournaras/DIAS-GDELT
    # has a lastupdate.txt saved as 20180326191500.export.CSV.zip) is a broken download, to be
    # reported as such rather than parsed as a CSV of the wrong format.
    if is_zip(data) or source.lower().endswith(".zip"):
        chunks, largest = line_chunks(stream_gdelt_zip(data, max_uncompressed_bytes=cap), CHUNK_BYTES), cap
    else:
        chunks, largest = byte_chunks(data, CHUNK_BYTES), len(data)
    most = most_lines(largest, kind)
    lines = size = 0
    for chunk in chunks:
        first_line = lines
        lines += count_lines(chunk)
        size += len(chunk)
        if lines <= most:
            yield plan_read(chunk, source, kind, first_line)
        else:
            file.parts.clear()
    check_line_count(lines, size, source, kind)


def _read_into(plans: list[tuple[_File, ReadPlan]], kind: Kind) -> None:
    """Read ``plans`` together and add each result to its file."""
    for file, plan in plans:
        plan.bom_is_data = file.votes[len(SCHEMAS[kind])] > 0
    for (file, _), part in zip(plans, _parse_plans([plan for _, plan in plans], kind)):
        file.add(part, kind)


def _parse_plans(plans: list[ReadPlan], kind: Kind) -> list[ParsedFile | Exception]:
    if not plans:
        return []
    read = read_csv_lines(joined_csv(plans), kind, sum(plan.n_rows for plan in plans))
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
        return _parse_plans([line_by_line(plan, kind)], kind)

    fields, numbers_typed = read
    rows = convert_frame(fields, numbers_typed, kind)
    reasons = value_reasons(fields, rows, REQUIRED_COLUMNS[kind])
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
                numbers = line_numbers(positions, [number for number, _ in found])
                found = sorted([*found, *zip(numbers, file_reasons.filter(failed).to_list())])
                file_rows = file_rows.filter(~failed)
        offset += plan.n_rows
        rejects = _shape_rejects(plan, found)
        parsed.append(ParsedFile(kind, plan.source, file_rows, rejects, plan.total_lines))
    return parsed


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
    votes[len(SCHEMAS[kind])] += part.total_lines - others
    return votes


_NO_REJECTS = pl.DataFrame(schema=REJECTS_SCHEMA)


def _shape_rejects(plan: ReadPlan, found: list[tuple[int, str]]) -> pl.DataFrame:
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
