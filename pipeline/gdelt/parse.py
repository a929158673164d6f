"""Parse GDELT 2.0 events exports and mentions files into typed polars frames.

The files are TAB-separated, have no header and no quoting, and end each record with ``\\n``
(the codebook; ``../shared/notes/gdelt-formats.md`` §1). Parsing keeps every line accounted for:
each line of the file ends up either in ``rows`` (typed per ``schema.py``) or in ``rejects`` with
its line number, its bytes as received and the reason, so ``rows.height + rejects.height ==
total_lines`` always.

Line rules:

* The final ``\\n`` is optional. The empty string after it is not a line, but a blank line
  anywhere else is one, rejected as ``empty_line``.
* CRLF is tolerated: one ``\\r`` right before the ``\\n`` (or at the end of the file) is not part
  of the last field. GDELT writes LF only, but a copy that went through a CRLF tool (as the
  lookup files did, quirk 12) would otherwise glue ``\\r`` onto SOURCEURL or Extras without any
  error. A line holding only ``\\r`` is an ``empty_line``. ``raw_line`` keeps the ``\\r``.
* An empty field is null; that is normal (blank actors, blank geo). Only the key columns
  (:data:`REQUIRED_COLUMNS`) must be filled, because rows are upserted on GLOBALEVENTID and
  partitioned on the batch timestamp.
* Numeric fields follow polars' CSV number reader, which skips leading spaces: ``" 3"`` is read
  as 3, and a numeric field of spaces only is empty (null). Trailing spaces are not skipped
  (``"3 "`` is a ``bad_value``). Dates and timestamps get no such leeway.

Reject reasons, one per line, checked in this order:

* ``invalid_utf8``: the line is not valid UTF-8.
* ``empty_line``: nothing on the line.
* ``field_count:N``: the line has N TAB-separated fields instead of the schema's count.
* ``bad_value:Col[,Col…]``: the named fields cannot be read as their type (letters in an
  integer, a SQLDATE that is not a real YYYYMMDD date, a timestamp that is not
  YYYYMMDDHHMMSS with valid parts).
* ``missing_value:Col[,Col…]``: the named key columns are empty.

A file whose most common field count is not the expected one is not rejected line by line: it is
the wrong kind of file (GDELT 1.0, mentions given as export, GKG …) and :class:`GdeltFormatError`
says which.

Speed: nearly every real file is clean, and that is proved from whole-buffer facts (see
:func:`_parse`), so one ``pl.read_csv`` reads it, with the numeric columns typed by the reader
itself. A file that fails the proof is split into lines once to find the bad ones; those are left
out and the rest is read with the same single ``pl.read_csv``, so both paths split fields
identically. Only when the reader refuses a number are the columns read as text and cast, with
the same rules as the reader's (see :data:`_NUMBER_TEXT`), so a row's fate never depends on the
other lines of its file. :func:`parse_files` parses many files at once on a few threads.
"""

from __future__ import annotations

import functools
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from typing import Literal

import polars as pl

from pipeline.gdelt.archive import is_zip, open_gdelt_zip
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

_SCHEMAS: dict[str, pl.Schema] = {"export": EXPORT_SCHEMA, "mentions": MENTIONS_SCHEMA}
_DATE_TYPES = (SQL_DATE, TIMESTAMP)
# What the CSV reader is asked for first: numbers typed by the reader (the cheapest way to type
# them), dates and timestamps as text, converted afterwards with the exact-shape checks below.
_READ_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema({n: pl.String if t in _DATE_TYPES else t for n, t in schema.items()})
    for kind, schema in _SCHEMAS.items()
}
# And when the reader refuses a number: every column as text, so the bad value is kept and
# reported instead of failing the whole read.
_TEXT_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema({name: pl.String for name in schema.names()}) for kind, schema in _SCHEMAS.items()
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


class GdeltFormatError(ValueError):
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
                f"{self.source}: {self.rows.height} rows + {self.rejects.height} rejects "
                f"!= {self.total_lines} lines"
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


def parse_files(
    items: Iterable[tuple[bytes, str]], kind: Kind, workers: int | None = None
) -> Iterator[ParsedFile]:
    """Parse ``(data, source)`` pairs of one ``kind`` on ``workers`` threads (default: one per
    core); yield the :class:`ParsedFile` of each, in the order of ``items``.

    polars does the heavy lifting without the GIL and uses about one core for a 15-minute file,
    so a day of files parses nearly ``workers`` times faster this way. ``items`` is consumed
    lazily: at most ``2 × workers`` files are read ahead and held, parsed or not. A file's
    exception is raised when its turn comes, after every file before it has been yielded; the
    files after it that were not started yet are then not parsed.
    """
    parse = {"export": parse_export, "mentions": parse_mentions}[kind]
    workers = workers or default_workers()
    if workers == 1:
        for data, source in items:
            yield parse(data, source)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gdelt-parse")
    ahead: deque[Future[ParsedFile]] = deque()
    try:
        for data, source in items:
            ahead.append(pool.submit(parse, data, source))
            if len(ahead) >= 2 * workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _parse(data: bytes, source: str, kind: Kind) -> ParsedFile:
    schema = _SCHEMAS[kind]
    # A source named *.zip must be one: text saved under a zip's name (quirk 3) is a broken
    # download, to be reported as such rather than parsed as a CSV of the wrong format.
    if is_zip(data) or source.lower().endswith(".zip"):
        _, data = open_gdelt_zip(data)
    if not data:
        # A real 15-minute file can be near-empty (an outage, quirk 2); empty is its limit.
        return ParsedFile(
            kind, source, pl.DataFrame(schema=schema), pl.DataFrame(schema=REJECTS_SCHEMA), 0
        )

    total_lines = data.count(b"\n") + (not data.endswith(b"\n"))
    # The clean-file proof. The reader raises on any line with more fields than the schema and
    # on invalid UTF-8, so once it succeeds every line decodes and none has more than
    # ``fields - 1`` TABs. With the TAB total at exactly ``(fields - 1) × lines``, no line can
    # have fewer either (a blank line has none). The row count check (in _read) makes sure the
    # reader saw the same lines as counted here.
    read = None
    if data.count(b"\t") == (len(schema) - 1) * total_lines:
        read = _read(data, kind, total_lines)
    lines: list[bytes] | None = None  # data split into lines, only when a line must be quoted
    if read is not None:
        kept = None  # row i is line i + 1
        found: list[tuple[int, str]] = []
    else:
        lines = _split_lines(data)
        found = _line_rejects(lines, kind, source, _undecodable_lines(data))
        kept_lines = _without(lines, [number - 1 for number, _ in found])
        read = _read(b"\n".join(kept_lines), kind, len(kept_lines))
        if read is None:
            raise RuntimeError(
                f"{source}: {len(kept_lines)} well-formed lines could not be read back as as many "
                "rows; the line splitter and the CSV reader disagree"
            )
        kept = found

    rows = read.with_columns(_conversions(kind, read.schema, _odd_date_columns(read, kind)))
    reasons = _value_reasons(read, rows, REQUIRED_COLUMNS[kind])
    if reasons is not None:
        failed = reasons.is_not_null()
        positions = failed.arg_true().to_list()
        numbers = _line_numbers(positions, [] if kept is None else [n for n, _ in kept])
        found = sorted([*found, *zip(numbers, reasons.filter(failed).to_list())])
        rows = rows.filter(~failed)
    if found and lines is None:
        lines = _split_lines(data)
    return ParsedFile(kind, source, rows, _shape_rejects(lines, found, source), total_lines)


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


def _read(csv: bytes, kind: str, n_lines: int) -> pl.DataFrame | None:
    """The ``n_lines`` lines of ``csv`` as one frame (numbers typed, dates and timestamps as text
    for :func:`_conversions`), or None when a line is not well-formed: more fields than the
    schema, undecodable, or the row count is off.

    When the reader refuses a number, the file is read again as text with the numeric columns
    prepared by :data:`_NUMBER_TEXT`; their casts then find the bad values line by line.
    """
    if not csv:
        return pl.DataFrame(schema=_READ_SCHEMAS[kind]) if n_lines == 0 else None
    try:
        frame = _csv(csv, _READ_SCHEMAS[kind])
    except pl.exceptions.PolarsError:
        # A number the reader refused, a line with too many fields, or bytes that are not UTF-8
        # (polars validates strings). Checking the UTF-8 first spares a second read of a file
        # whose trouble is there.
        if not _is_utf8(csv):
            return None
        try:
            frame = _csv(csv, _TEXT_SCHEMAS[kind]).with_columns(_number_text(kind))
        except pl.exceptions.PolarsError:
            return None
    return frame if frame.height == n_lines else None


def _is_utf8(data: bytes) -> bool:
    try:
        pl.Series([data], dtype=pl.Binary).cast(pl.String)
    except pl.exceptions.PolarsError:
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


# The column, as an expression, from text to its type: numbers cast, dates parsed without and
# with the shape check. chrono's near misses are rare, so the shape is only checked where a
# distinct value of the column lacks it (:func:`_odd_date_columns`).
def _number(name: str, dtype: pl.DataType) -> pl.Expr:
    return pl.col(name).cast(dtype, strict=False)


def _date(name: str, dtype: pl.DataType, *, check_shape: bool) -> pl.Expr:
    column = pl.col(name)
    fmt, shape = _DATE_FORMATS[dtype]
    if dtype == SQL_DATE:
        parsed = column.str.to_date(fmt, strict=False)
    else:
        parsed = column.str.to_datetime(
            fmt, time_unit=dtype.time_unit, time_zone=dtype.time_zone, strict=False
        )
    return pl.when(column.str.contains(shape)).then(parsed) if check_shape else parsed


@functools.cache
def _conversions(kind: str, read_schema: pl.Schema, odd_dates: frozenset[str]) -> list[pl.Expr]:
    """The expressions that take a frame from :func:`_read` to ``kind``'s schema, built once per
    case: with 61 columns, building them costs as much as running them on a 15-minute file."""
    exprs = []
    for name, dtype in _SCHEMAS[kind].items():
        if dtype in _DATE_TYPES:
            exprs.append(_date(name, dtype, check_shape=name in odd_dates).alias(name))
        elif read_schema[name] != dtype:
            exprs.append(_number(name, dtype).alias(name))
    return exprs


def _odd_date_columns(read: pl.DataFrame, kind: str) -> frozenset[str]:
    """The date columns with a distinct value that is not exactly digits of the right width.

    A file holds a handful of distinct dates and usually one DATEADDED, so checking the distinct
    values is far cheaper than checking every row."""
    columns = [name for name, dtype in _SCHEMAS[kind].items() if dtype in _DATE_TYPES]
    shaped = read.select(
        pl.col(name).unique().str.contains(_DATE_FORMATS[_SCHEMAS[kind][name]][1]).all()
        for name in columns
    ).row(0)
    return frozenset(name for name, ok in zip(columns, shaped) if not ok)


def _split_lines(data: bytes) -> list[bytes]:
    """The lines of ``data`` without their ``\\n``; the empty string after a final ``\\n`` is not
    a line."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return lines


def _without(lines: list[bytes], skip: list[int]) -> list[bytes]:
    """``lines`` without the (sorted) positions in ``skip``."""
    if not skip:
        return lines
    bounds = zip([-1, *skip], [*skip, len(lines)])
    return list(chain.from_iterable(lines[start + 1 : end] for start, end in bounds))


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


def _undecodable_lines(data: bytes) -> list[int]:
    """Line numbers (1-based) of the lines that are not valid UTF-8.

    The loop runs once per undecodable line, not per line: each pass decodes up to the next
    error, so the buffer is decoded about once. ``\\n`` never occurs inside a multi-byte UTF-8
    sequence, so cutting at it is always safe.
    """
    view = memoryview(data)
    found: list[int] = []
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
            newlines_before += data.count(b"\n", counted, start)
            counted = start
            found.append(newlines_before + 1)
            pos = end


def _line_rejects(
    lines: list[bytes], kind: str, source: str, undecodable: list[int]
) -> list[tuple[int, str]]:
    """``(line_number, reason)`` of every line that is not well-formed, in line order.

    Raises :class:`GdeltFormatError` unless the schema's field count is strictly the most common
    one. Only decodable, non-blank lines vote, so a handful of broken lines cannot make a file
    look like another format, and a file of nothing but broken lines is left to the rejects.
    """
    expected = len(_SCHEMAS[kind])
    tabs = list(map(bytes.count, lines, repeat(b"\t")))
    wrong = compress(count(), map((expected - 1).__ne__, tabs))
    undecodable_at = {number - 1 for number in undecodable}
    votes = Counter(tabs)
    found = []
    for at in sorted(undecodable_at.union(wrong)):
        if at in undecodable_at:
            reason = "invalid_utf8"
        elif lines[at] in (b"", b"\r"):
            reason = "empty_line"
        else:
            found.append((at + 1, f"field_count:{tabs[at] + 1}"))
            continue
        votes[tabs[at]] -= 1  # not a voter
        found.append((at + 1, reason))
    _check_format({n + 1: c for n, c in votes.items() if c}, kind, expected, source)
    return found


def _check_format(votes: dict[int, int], kind: str, expected: int, source: str) -> None:
    """Raise :class:`GdeltFormatError` unless ``expected`` is strictly the most common field
    count among the voters (``votes``: field count -> lines)."""
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


def _value_reasons(
    fields: pl.DataFrame, rows: pl.DataFrame, required: tuple[str, ...]
) -> pl.Series | None:
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


def _shape_rejects(
    lines: list[bytes] | None, found: list[tuple[int, str]], source: str
) -> pl.DataFrame:
    """REJECTS_SCHEMA rows for ``found``, each with its line's bytes exactly as received."""
    if not found or lines is None:
        return pl.DataFrame(schema=REJECTS_SCHEMA)
    numbers, reasons = zip(*found)
    return pl.DataFrame(
        {
            "file": [source] * len(found),
            "line_number": numbers,
            "reason": reasons,
            "raw_line": [lines[number - 1] for number in numbers],
        },
        schema=REJECTS_SCHEMA,
    )
