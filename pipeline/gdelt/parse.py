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
:func:`_read_if_clean`), so one ``pl.read_csv`` reads it directly. A file that fails the proof
is split into lines once to find the bad ones; those are cut out of the bytes and the rest is
read with the same single ``pl.read_csv``, so both paths split fields identically.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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
    "parse_mentions",
]

# Key columns a row is useless without: the upsert key and the batch timestamp(s) partitioned on.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "export": ("GLOBALEVENTID", "DATEADDED"),
    "mentions": ("GLOBALEVENTID", "EventTimeDate", "MentionTimeDate"),
}

_SCHEMAS: dict[str, pl.Schema] = {"export": EXPORT_SCHEMA, "mentions": MENTIONS_SCHEMA}
# What the CSV reader is asked for: every column as text, so a bad value is kept and reported
# instead of failing the whole read.
_TEXT_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema({name: pl.String for name in schema.names()}) for kind, schema in _SCHEMAS.items()
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

    kind: Literal["export", "mentions"]
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


# Rejects while parsing: where the line sits in the buffer, so its bytes can be cut out or copied.
_FOUND = pl.Schema(
    {"line_number": pl.Int64, "reason": pl.String, "start": pl.Int64, "length": pl.Int64}
)


def _parse(data: bytes, source: str, kind: Literal["export", "mentions"]) -> ParsedFile:
    schema, text_schema = _SCHEMAS[kind], _TEXT_SCHEMAS[kind]
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
    fields = _read_if_clean(data, text_schema, total_lines)
    if fields is not None:
        line_numbers = pl.int_range(1, total_lines + 1, dtype=pl.Int64, eager=True)
        lines = None  # indexed below only if a value is bad and its bytes are needed
        found = pl.DataFrame(schema=_FOUND)
    else:
        lines = _classify(_index_lines(data, total_lines), len(schema))
        _check_format(lines, kind, len(schema), source)
        found = lines.filter(~pl.col("ok")).select(
            "line_number", _LINE_REASON, "start", "length"
        )
        line_numbers = lines.filter("ok")["line_number"]
        fields = _read_fields(_cut_out(data, found), text_schema)
        if fields.height != line_numbers.len():
            raise RuntimeError(
                f"{source}: {line_numbers.len()} well-formed lines read back as {fields.height} "
                "rows; the line splitter and the CSV reader disagree"
            )

    rows = fields.with_columns(_cast_expressions(kind))
    reasons = _value_reasons(fields, rows, REQUIRED_COLUMNS[kind])
    if reasons is not None:
        failed = reasons.is_not_null()
        if lines is None:
            lines = _index_lines(data, total_lines)
        bad_values = pl.DataFrame(
            {"line_number": line_numbers.filter(failed), "reason": reasons.filter(failed)}
        ).join(lines.select("line_number", "start", "length"), on="line_number", how="left")
        rows = rows.filter(~failed)
        found = pl.concat([found, bad_values.select(_FOUND.names())]).sort("line_number")
    return ParsedFile(kind, source, rows, _shape_rejects(data, found, source), total_lines)


def _read_fields(csv: bytes, text_schema: pl.Schema) -> pl.DataFrame:
    """Split ``csv`` into the String columns of ``text_schema``; empty fields become null.

    polars drops one ``\\r`` before each ``\\n`` (and at the end of the buffer) itself.
    """
    if not csv:
        return pl.DataFrame(schema=text_schema)
    return pl.read_csv(
        csv,
        has_header=False,
        separator="\t",
        quote_char=None,  # GDELT never quotes; a '"' is data
        schema=text_schema,
    )


def _read_if_clean(data: bytes, text_schema: pl.Schema, total_lines: int) -> pl.DataFrame | None:
    """Read ``data`` in one go if every line provably has the right field count, else None.

    The reader raises on any line with more fields than the schema and on invalid UTF-8, so once
    it succeeds every line decodes and none has more than ``fields - 1`` TABs. With the TAB total
    at exactly ``(fields - 1) × lines``, no line can have fewer either (a blank line has none).
    The row count check makes sure the reader saw the same lines we counted.
    """
    if data.count(b"\t") != (len(text_schema) - 1) * total_lines:
        return None
    try:
        fields = _read_fields(data, text_schema)
    except pl.exceptions.PolarsError:
        # A line with too many fields, or bytes that are not UTF-8 (polars validates strings).
        # The line-by-line path finds and names the offending lines.
        return None
    return fields if fields.height == total_lines else None


def _index_lines(data: bytes, total_lines: int) -> pl.DataFrame:
    """One row per line: ``line_number`` (1-based), byte ``start`` and ``length`` (without the
    ``\\n``) in ``data``, and ``text`` (null where the line is not UTF-8)."""
    undecodable = _undecodable_lines(data)
    # polars turns the bytes into text without a round trip through a Python str; the lines that
    # would not decode are emptied first (their terminators stay, so numbering holds).
    view = memoryview(data)
    kept, pos = [], 0
    for _, start, end in undecodable:
        kept.append(view[pos:start])
        pos = end
    kept.append(view[pos:])
    decodable = b"".join(kept) if undecodable else data
    # ``head`` drops the empty string after a final terminator, which is not a line.
    lines = (
        pl.Series("text", [decodable], dtype=pl.Binary)
        .cast(pl.String)
        .str.split("\n")
        .explode()
        .head(total_lines)
    )
    length = lines.str.len_bytes().cast(pl.Int64)
    if undecodable:
        positions = [number - 1 for number, _, _ in undecodable]
        length.scatter(positions, [end - start for _, start, end in undecodable])
        lines.scatter(positions, None)
    return pl.DataFrame(
        {
            "line_number": pl.int_range(1, total_lines + 1, dtype=pl.Int64, eager=True),
            "start": (length + 1).cum_sum() - (length + 1),
            "length": length,
            "text": lines,
        }
    )


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
            newlines_before += data.count(b"\n", counted, start)
            counted = start
            found.append((newlines_before + 1, start, end))
            pos = end


def _classify(lines: pl.DataFrame, expected: int) -> pl.DataFrame:
    """Add ``n_fields``, ``voter`` (decodable and not blank) and ``ok`` (well-formed)."""
    text = pl.col("text")
    return lines.with_columns(
        (text.str.count_matches("\t", literal=True) + 1).alias("n_fields"),
        (text.is_not_null() & (text != "") & (text != "\r")).alias("voter"),
    ).with_columns(
        (pl.col("voter") & (pl.col("n_fields") == expected)).fill_null(False).alias("ok")
    )


# Why a not-``ok`` line is rejected; only ever evaluated on the few bad lines.
_LINE_REASON = (
    pl.when(pl.col("text").is_null())
    .then(pl.lit("invalid_utf8"))
    .when(~pl.col("voter"))
    .then(pl.lit("empty_line"))
    .otherwise(pl.format("field_count:{}", pl.col("n_fields")))
    .alias("reason")
)


def _check_format(lines: pl.DataFrame, kind: str, expected: int, source: str) -> None:
    """Raise :class:`GdeltFormatError` unless ``expected`` is strictly the most common field count.

    Only decodable, non-blank lines vote, so a handful of broken lines cannot make a file look
    like another format, and a file of nothing but broken lines is left to the rejects.
    """
    voters = lines.filter("voter")
    expected_votes = int((voters["n_fields"] == expected).sum())
    if 2 * expected_votes > voters.height:  # a majority: the common case, without a group_by
        return
    votes = voters.group_by("n_fields").len().sort(["len", "n_fields"], descending=[True, False])
    rivals = votes.filter(pl.col("n_fields") != expected)
    if rivals.is_empty():
        return
    detected, detected_votes = rivals.row(0)
    if detected_votes < expected_votes:
        return
    what = KNOWN_FIELD_COUNTS.get(detected, f"no known GDELT format ({detected} fields per line)")
    counts = ", ".join(f"{n} fields ×{c:,}" for n, c in votes.iter_rows())
    raise GdeltFormatError(
        f"{source}: this is {what}, not {KNOWN_FIELD_COUNTS[expected]} ({expected} columns) "
        f"as expected by parse_{kind} (lines by field count: {counts})",
        expected=expected,
        detected=detected,
    )


def _cut_out(data: bytes, found: pl.DataFrame) -> bytes:
    """``data`` without the lines in ``found`` (each with its ``\\n``); one pass per bad line."""
    view = memoryview(data)
    kept = []
    pos = 0
    for start, length in found.select("start", "length").iter_rows():
        kept.append(view[pos:start])
        pos = start + length + 1
    kept.append(view[pos:])
    return b"".join(kept)


@functools.cache
def _cast_expressions(kind: str) -> list[pl.Expr]:
    """The casts from the text columns to ``kind``'s schema, built once: with 61 columns, building
    them costs as much as running them on a 15-minute file."""
    return [
        _typed(name, dtype).alias(name)
        for name, dtype in _SCHEMAS[kind].items()
        if dtype != pl.String
    ]


def _typed(name: str, dtype: pl.DataType) -> pl.Expr:
    """Cast one String column to ``dtype``; a value that does not fit becomes null."""
    column = pl.col(name)
    if dtype == SQL_DATE:
        fmt, shape = _DATE_FORMATS[dtype]
        return pl.when(column.str.contains(shape)).then(column.str.to_date(fmt, strict=False))
    if dtype == TIMESTAMP:
        fmt, shape = _DATE_FORMATS[dtype]
        parsed = column.str.to_datetime(
            fmt, time_unit=dtype.time_unit, time_zone=dtype.time_zone, strict=False
        )
        return pl.when(column.str.contains(shape)).then(parsed)
    return column.cast(dtype, strict=False)


def _value_reasons(
    fields: pl.DataFrame, rows: pl.DataFrame, required: tuple[str, ...]
) -> pl.Series | None:
    """Per row, ``bad_value:…`` / ``missing_value:…`` or null; None when every row is fine.

    A cast never turns null into a value, so equal null counts per column prove that nothing
    failed. That costs nothing, and the row-level search only runs for the columns that differ.
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


def _shape_rejects(data: bytes, found: pl.DataFrame, source: str) -> pl.DataFrame:
    """REJECTS_SCHEMA rows for ``found``, each with its line's bytes exactly as received."""
    if found.is_empty():
        return pl.DataFrame(schema=REJECTS_SCHEMA)
    raw = [data[start : start + length] for start, length in found.select("start", "length").iter_rows()]
    return pl.DataFrame(
        {
            "file": [source] * found.height,
            "line_number": found["line_number"],
            "reason": found["reason"],
            "raw_line": raw,
        },
        schema=REJECTS_SCHEMA,
    )
