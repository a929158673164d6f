"""From the CSV bytes the reader gets to rows of ``schema.py``'s types, and the reason of each row
whose value did not fit.

One ``pl.read_csv`` per batch (:func:`read_csv_lines`: numbers typed by the reader, dates as text, all text
when the reader refuses a number), then one set of cached expressions per case (:func:`convert_frame`:
dates parsed with the exact-shape check only where a near miss is present), then the
``bad_value:…`` / ``missing_value:…`` reasons (:func:`value_reasons`). The names stay private:
pipeline/gdelt/parse.py is their only user (docs/data-layout.md, "Parsing GDELT files").
"""

from __future__ import annotations

import functools

import polars as pl

from pipeline.gdelt.lines import is_utf8
from pipeline.gdelt.schema import SCHEMAS, SQL_DATE, TIMESTAMP

_DATE_TYPES = (SQL_DATE, TIMESTAMP)


# What the CSV reader is asked for first: numbers typed by the reader (the cheapest way to type
# them), dates and timestamps as text, converted afterwards with the exact-shape checks below.
_READ_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema({n: pl.String if t in _DATE_TYPES else t for n, t in schema.items()})
    for kind, schema in SCHEMAS.items()
}


# And when the reader refuses a number: every column as text, so the bad value is kept and
# reported instead of failing the whole read.
_TEXT_SCHEMAS: dict[str, pl.Schema] = {
    kind: pl.Schema(dict.fromkeys(schema.names(), pl.String)) for kind, schema in SCHEMAS.items()
}


_NUMERIC_COLUMNS: dict[str, list[tuple[str, pl.DataType]]] = {
    kind: [(n, t) for n, t in schema.items() if t != pl.String and t not in _DATE_TYPES]
    for kind, schema in SCHEMAS.items()
}


# How the date columns are written, and the exact shape a value must have. chrono alone accepts
# near misses ("2018032" as 2018-03-02, a leading space, second 60 as a leap second), so the value
# must also be all ASCII digits of the right width with seconds below 60; chrono then checks that
# month, day, hour and minute exist.
_DATE_FORMATS: dict[pl.DataType, tuple[str, str]] = {
    SQL_DATE: ("%Y%m%d", r"^[0-9]{8}$"),
    TIMESTAMP: ("%Y%m%d%H%M%S", r"^[0-9]{12}[0-5][0-9]$"),
}


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


def read_csv_lines(csv: bytes, kind: str, n_lines: int) -> tuple[pl.DataFrame, bool] | None:
    """The ``n_lines`` lines of ``csv`` as one frame, and whether its numbers are typed yet; or
    None when a line is not well-formed: more fields than the schema, undecodable, or the row
    count is off.

    The numbers come typed by the reader, the dates and timestamps as text (for
    :func:`convert_frame`). When the reader refuses a number, the file is read again as text with the
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
        if not is_utf8(csv):
            return None
        try:
            frame = _csv(csv, _TEXT_SCHEMAS[kind]).with_columns(_number_text(kind))
        except pl.exceptions.PolarsError:
            return None
    return (frame, typed) if frame.height == n_lines else None


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
    """The expressions that take a frame from :func:`read_csv_lines` to ``kind``'s schema, with the shape
    check on the date columns in ``checked``. Built once per case: with 61 columns, building them
    costs as much as running them on a 15-minute file."""
    exprs = []
    for name, dtype in SCHEMAS[kind].items():
        if dtype in _DATE_TYPES:
            exprs.append(_date(name, dtype, check_shape=name in checked).alias(name))
        elif dtype != pl.String and not numbers_typed:
            exprs.append(_number(name, dtype).alias(name))
    return exprs


@functools.cache
def _shape_flags(kind: str) -> tuple[list[str], list[pl.Expr]]:
    """Per date column, a flag: every distinct value has the exact shape."""
    names = [name for name, dtype in SCHEMAS[kind].items() if dtype in _DATE_TYPES]
    flags = [
        pl.col(name).unique().str.contains(_DATE_FORMATS[SCHEMAS[kind][name]][1]).all().alias(f"shape:{name}")
        for name in names
    ]
    return names, flags


def convert_frame(read: pl.DataFrame, numbers_typed: bool, kind: str) -> pl.DataFrame:
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


def value_reasons(fields: pl.DataFrame, rows: pl.DataFrame, required: tuple[str, ...]) -> pl.Series | None:
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
