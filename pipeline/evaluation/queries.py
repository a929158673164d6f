"""What an evaluation reads: a split's queries, checked before anything uses them, and the event
history up to a cutoff.

A queries file may come from any release directory a user was handed (docs/evaluate-your-agent.md,
"3. Run an agent"), so it is read only within bounds checked on its footer, and refused with one
line (InvalidQueries) otherwise. The history is the event database's monthly files up to the
cutoff, which the baselines forecast from (pipeline/evaluation/run.py runs both).
"""

from __future__ import annotations

import json
import os
import re
from datetime import date
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.evaluation.metrics import gold_relations
from pipeline.evaluation.mirai_predictions import is_query_id
from pipeline.evaluation.score_inputs import MAX_PREDICTIONS_BYTES, MAX_RECORDS
from pipeline.reference.tables import iso3_codes
from pipeline.release.layout import DATABASE_TABLES, check_inside, shown
from pipeline.splits.database import MonthNotReady
from pipeline.splits.schema import QUERIES_SCHEMA
from pipeline.storage import DataLayout
from pipeline.untrusted_parquet import UntrustedParquetError, check_footer, read_untrusted_parquet, text_bytes

MONTH_FILE = re.compile(r"^month=(\d{4})-(\d{2})\.parquet$")


# A queries file is read only within these bounds, checked on its footer before a row is decoded
# (a month has ~2,000 queries, ~200 KB): no more rows than `mirai score` reads predictions, and no
# more bytes, on disk or decoded, than a predictions file may have.
MAX_QUERIES = MAX_RECORDS


MAX_QUERIES_BYTES = MAX_PREDICTIONS_BYTES


MAX_QUERIES_DECODED_BYTES = 4 * MAX_QUERIES_BYTES


MAX_QUERY_CELL_BYTES = 64 * 2**10  # a gold answer_dict of every CAMEO code is ~3 KB


# The columns an evaluation reads (s_name and o_name too, when present: the prompt's names).
QUERY_COLUMNS = ("query_id", "date", "s", "o", "answer_dict")


class InvalidQueries(ValueError):
    """A queries file is not a split's; the message is one line naming the file and the problem."""


def load_queries(source: pl.DataFrame | Path | str, query_set: str | None = None) -> tuple[pl.DataFrame, str]:
    """The queries and the name of their set: a split directory means its queries.parquet, a
    parquet file is named by its stem (queries_sample), a frame by ``query_set`` (default
    "queries"). A file is checked as read_queries does."""
    if isinstance(source, pl.DataFrame):
        return source, query_set or "queries"
    path = Path(source)
    if path.is_dir():
        path = path / "queries.parquet"
    return read_queries(path), query_set or path.stem


def read_queries(path: Path) -> pl.DataFrame:
    """A split's queries file, checked before anything uses it, since it may come from a release
    directory anyone handed over (docs/evaluate-your-agent.md, "3. Run an agent"): its size and
    row count from the footer, before a row is decoded; the columns an evaluation reads, with
    QUERIES_SCHEMA's types and no nulls; unique query ids that are file names (they name MIRAI's
    round<N>/<query_id>.json files); country codes the reference tables know; gold answers as
    `mirai score` takes them (CAMEO codes); one month. Raises InvalidQueries."""

    def refused(problem: str) -> InvalidQueries:
        return InvalidQueries(f"{path}: {problem}; refused")

    try:
        if not os.path.isfile(path):
            raise refused("not a regular file")
        size = os.path.getsize(path)
        if size > MAX_QUERIES_BYTES:
            raise refused(f"{size:,} bytes, more than the {MAX_QUERIES_BYTES:,} a split may take")
        check_footer(path)
        footer = pq.read_metadata(path)
    except UntrustedParquetError as exc:
        raise refused(str(exc)) from None
    except (OSError, pa.ArrowException) as exc:
        raise refused(f"not a parquet file ({type(exc).__name__})") from None
    decoded = sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    if footer.num_rows > MAX_QUERIES:
        raise refused(f"{footer.num_rows:,} rows, more than the {MAX_QUERIES:,} a split may hold")
    if max(size, decoded) > MAX_QUERIES_BYTES:
        raise refused(f"{max(size, decoded):,} bytes, more than the {MAX_QUERIES_BYTES:,} a split may take")
    try:  # the footer is the file's word: decoded where a lie costs a child process
        frame = read_untrusted_parquet(Path(path).read_bytes(), MAX_QUERIES_DECODED_BYTES)
    except OSError as exc:
        raise refused(f"not a parquet file ({type(exc).__name__})") from None
    except UntrustedParquetError as exc:
        raise refused(str(exc)) from None
    if frame.height > MAX_QUERIES:  # the footer's num_rows is the file's word too
        raise refused(f"{frame.height:,} rows, more than the {MAX_QUERIES:,} a split may hold")
    longest, total = text_bytes(frame)
    if longest > MAX_QUERY_CELL_BYTES:
        raise refused(f"a text cell longer than {MAX_QUERY_CELL_BYTES:,} bytes")
    if total > MAX_QUERIES_BYTES:
        raise refused(f"more than {MAX_QUERIES_BYTES:,} bytes of text")
    present = [c for c in ("s_name", "o_name") if c in frame.columns]
    for column in (*QUERY_COLUMNS, *present):
        if column not in frame.columns:
            raise refused(f"no {column!r} column (a split's queries file has {', '.join(QUERIES_SCHEMA)})")
        if frame.schema[column] != QUERIES_SCHEMA[column]:
            raise refused(f"column {column!r} is {frame.schema[column]}, not {QUERIES_SCHEMA[column]}")
        if frame.get_column(column).null_count():
            raise refused(f"column {column!r} holds {frame.get_column(column).null_count()} null(s)")
    if frame.is_empty():
        raise refused("no queries")
    ids = frame.get_column("query_id")
    bad = next((q for q in ids if not is_query_id(q)), None)
    if bad is not None:
        raise refused(f"query_id {shown(bad)} is not 1-100 letters, digits and '._-' starting alphanumeric")
    if ids.is_duplicated().any():
        raise refused(f"query_id {shown(ids.filter(ids.is_duplicated())[0])} appears twice")
    countries = iso3_codes()
    for column in ("s", "o"):
        unknown = frame.get_column(column).filter(~frame.get_column(column).is_in(list(countries)))
        if unknown.len():
            raise refused(f"{column} {shown(unknown[0])} is not a country code the reference tables know")
    for query_id, answer in frame.select("query_id", "answer_dict").iter_rows():
        try:
            gold_relations(json.loads(answer))
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise refused(f"query {query_id}: answer_dict is not a gold answer ({shown(str(exc))})") from None
    months = frame.get_column("date").dt.truncate("1mo").unique().sort()
    if months.len() != 1:
        raise refused(
            f"its queries fall in {months.len()} months ({months[0].isoformat()[:7]} to {months[-1].isoformat()[:7]}), not one"
        )
    return frame


def release_queries(release: Path, query_set: str) -> pl.DataFrame:
    """The queries of a release directory for `mirai evaluate`, once what the run reads is safe to
    read: the directory may be any the user was handed, not one `mirai download` verified
    (docs/evaluate-your-agent.md, "3. Run an agent"). The queries file and every database month
    must be regular files inside the directory (check_inside: no link out of it); the queries pass
    read_queries and fall in the release's month, the newest of its database. Raises
    UnsafeRelease or InvalidQueries; the database files' contents are EventDatabase's to check."""
    queries_file = check_inside(release, release / f"{query_set}.parquet")
    months = set()
    for table in DATABASE_TABLES:
        for path in sorted((release / "database" / table).glob("month=*.parquet")):
            check_inside(release, path)
            if m := MONTH_FILE.match(path.name):
                months.add(f"{m[1]}-{m[2]}")
    frame = read_queries(queries_file)
    month = frame.get_column("date")[0].isoformat()[:7]
    if month != max(months, default=None):
        raise InvalidQueries(
            f"{queries_file}: its queries are dated {month}, but the release's database ends in "
            f"{max(months, default='no month')} (a release of month M holds the database up to M); refused"
        )
    return frame


def split_month(queries: pl.DataFrame) -> date:
    """The one month every query falls in."""
    months = queries.select(pl.col("date").dt.truncate("1mo").unique()).to_series().to_list()
    if len(months) != 1:
        raise ValueError(f"queries must come from one month, found {sorted(months) or 'none'}")
    return months[0]


def load_history(data_dir: Path | str, until: date) -> pl.LazyFrame:
    """(date, s, r, o) of every event in the event database dated on or before ``until``; only
    the monthly files that can hold such events are read."""
    directory = DataLayout(data_dir).database_dir() / "events"
    paths = sorted(
        path
        for path in directory.glob("month=*.parquet")
        if (m := MONTH_FILE.match(path.name)) and date(int(m[1]), int(m[2]), 1) <= until
    )
    if not paths:
        raise MonthNotReady(
            f"no event database month up to {until} under {directory}; materialise event_database first"
        )
    return pl.scan_parquet(paths).select("date", "s", "r", "o").filter(pl.col("date") <= until)
