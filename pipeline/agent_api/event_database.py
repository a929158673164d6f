"""The monthly event database of a data dir, as the gated tables an Environment holds.

``EventDatabase`` reads the month files (pipeline/splits/database.py writes them) once each, in the
in-memory layout environment.py describes (a month with no month file may instead be given as
day files, ``day=YYYY-MM-DD.parquet``: the live history `mirai download --live` writes,
pipeline/live/history.py; a month file, where there is one, is the month): events and news sorted ascending, each event's
``article_idx`` the row numbers of its articles in the concatenated news table. It hands each
query's Environment every month before the cutoff month whole and the cutoff month sliced at the
cutoff, and never opens a later month (docs/agent_api.md, "The gate"). A directory anyone handed
over is decoded under a bound (untrusted_files).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from pipeline.agent_api.environment import EVENT_COLUMNS, ISO_ENUM, NEWS_COLUMNS, REL_ENUM, ROOT_ENUM, Environment
from pipeline.agent_api.table_files import TableFiles
from pipeline.splits.database import EVENT_DB_SCHEMA, NEWS_DB_SCHEMA
from pipeline.storage import DataLayout, verified
from pipeline.untrusted_parquet import UntrustedParquetError, check_footer, read_untrusted_parquet, text_bytes

# The stored types (pipeline/splits/database.py) of the columns a month file is read for; the codes are
# then cast to the enums above, which refuses one outside the reference tables.
STORED_TYPES = {
    "events": {c: EVENT_DB_SCHEMA[c] for c in ("date", "s", "r", "o", "r1", "daily_mentions", "article_ids")},
    "news": {c: NEWS_DB_SCHEMA[c] for c in NEWS_COLUMNS},
}
_MONTH_FILE = re.compile(r"^month=(\d{4})-(\d{2})\.parquet$")
_DAY_FILE = re.compile(r"^day=(\d{4}-\d{2}-\d{2})\.parquet$")
# What one month file of a handed-over database may take once decoded: far above a month the
# pipeline writes, far below what would take a machine of our kind down.
MAX_UNTRUSTED_MONTH_BYTES = 4 * 2**30


def month_start(day: date) -> date:
    return day.replace(day=1)


def _day_of(name: str) -> date | None:
    """The day a ``day=YYYY-MM-DD.parquet`` file is of, None for any other name (or no real day)."""
    found = _DAY_FILE.match(name)
    try:
        return date.fromisoformat(found[1]) if found else None
    except ValueError:
        return None


class DatabaseFileError(ValueError):
    """A database month file cannot be used as it is (unreadable, other columns, rows dated
    outside its month); the message is one line naming the file."""


def _read_month(path: Path, table: str, untrusted: bool = False) -> pl.LazyFrame:
    """A month file as a LazyFrame, once its columns have the stored types. ``untrusted`` (a
    directory anyone handed over): decoded in a memory-capped child process, since a footer's sizes
    are the file's own word, and its text measured on the columns before any row is used."""
    try:
        if untrusted:
            check_footer(path)
        schema = pl.read_parquet_schema(path)
    except UntrustedParquetError as exc:
        raise DatabaseFileError(f"{path}: {exc}; refused") from None
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise DatabaseFileError(f"{path}: not a parquet file ({type(exc).__name__}); refused") from None
    for column, dtype in STORED_TYPES[table].items():
        if schema.get(column) != dtype:
            found = f"is {schema[column]}" if column in schema else "is missing"
            raise DatabaseFileError(f"{path}: column {column!r} {found}, not {dtype}; refused")
    if not untrusted:
        return pl.scan_parquet(path)
    if path.stat().st_size > MAX_UNTRUSTED_MONTH_BYTES:  # read whole below, to hand to the decoder
        raise DatabaseFileError(f"{path}: larger than {MAX_UNTRUSTED_MONTH_BYTES:,} bytes; refused")
    try:
        frame = read_untrusted_parquet(path.read_bytes(), MAX_UNTRUSTED_MONTH_BYTES, columns=list(STORED_TYPES[table]))
    except (OSError, UntrustedParquetError) as exc:
        raise DatabaseFileError(f"{path}: {exc}; refused") from None
    if text_bytes(frame)[1] > MAX_UNTRUSTED_MONTH_BYTES:
        raise DatabaseFileError(f"{path}: more than {MAX_UNTRUSTED_MONTH_BYTES:,} bytes of text; refused")
    return frame.lazy()


def month_end(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)


def _check_dates(frame: pl.DataFrame, first: date, last: date, span: str, path: Path) -> None:
    """Refuse a month (or day) file holding a row dated outside its month (day) ``span``, from
    ``first`` to ``last``, or undated: the gate hands every month before the cutoff's whole to an
    environment, so such a row would pass it."""
    dates = frame.get_column("date").drop_nulls()
    outside = dates.filter(~dates.is_between(first, last))
    undated = frame.get_column("date").null_count()
    if outside.len() or undated:
        latest = f", the latest {outside.max()}" if outside.len() else ""
        raise DatabaseFileError(
            f"{path}: {outside.len()} row(s) dated outside {span}{latest}, {undated} undated; refused (the gate "
            "passes a month before the cutoff's whole: nothing past a query's cutoff may reach its agent)"
        )


def _prepare_month(events: pl.LazyFrame, news: pl.LazyFrame, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One month's files in the in-memory layout; ``offset`` = news rows of all earlier months."""
    news_df = (
        news.select("article_id", "date", "title", "text")
        .sort(["date", "article_id"], descending=[False, True])
        .collect()
    )
    index = news_df.select("article_id", (pl.int_range(pl.len(), dtype=pl.UInt32) + offset).alias("idx"))
    events_df = (
        events.select("date", "s", "r", "o", "r1", "daily_mentions", "article_ids")
        .with_columns(
            pl.col("s").cast(ISO_ENUM),
            pl.col("o").cast(ISO_ENUM),
            pl.col("r").cast(REL_ENUM),
            pl.col("r1").cast(ROOT_ENUM),
        )
        .sort(["date", "daily_mentions", "s", "o", "r"], descending=[False, False, True, True, True])
        .with_row_index("__row")
        .collect()
    )
    # Article ids resolve within the month: an article's date is its events' date (MIRAI's alignment).
    links = (
        events_df.select("__row", pl.col("article_ids").alias("article_id"))
        .explode("article_id")
        .join(index, on="article_id", how="inner")
        .group_by("__row")
        .agg(pl.col("idx").sort().alias("article_idx"))
    )
    events_df = (
        events_df.join(links, on="__row", how="left", maintain_order="left")
        .with_columns(pl.col("article_idx").fill_null(pl.lit([], dtype=pl.List(pl.UInt32))))
        .select(EVENT_COLUMNS)
    )
    return events_df, news_df.select(NEWS_COLUMNS)


class EventDatabase:
    """The monthly database files of a data dir, loaded month by month on demand and kept in memory,
    so opening many environments (one per query) costs a concatenation and one slice.

    Trusted code only: it caches whole months, including days after any particular cutoff. Agents
    get Environments, never this object."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        allow_unconfined_sandbox: bool = False,
        sandbox_handover_grid_s: float | None = None,
        code_libraries: tuple[str, ...] = (),
        untrusted_files: bool = False,
    ):
        # A directory anyone handed over (`mirai evaluate`): its months decoded under a bound.
        self.untrusted_files = untrusted_files
        # Passed to every Environment.
        self.allow_unconfined_sandbox = allow_unconfined_sandbox
        self.sandbox_handover_grid_s = sandbox_handover_grid_s
        self.code_libraries = code_libraries
        self.layout = DataLayout(data_dir)
        events_dir = self.layout.database_dir() / "events"
        month_files = {
            date(int(m[1]), int(m[2]), 1)
            for p in events_dir.glob("month=*.parquet")
            if (m := _MONTH_FILE.match(p.name))
        }
        # {month: its day files' days}, for the months with no month file.
        self.days: dict[date, list[date]] = {}
        for day in sorted(d for p in events_dir.glob("day=*.parquet") if (d := _day_of(p.name))):
            if month_start(day) not in month_files:
                self.days.setdefault(month_start(day), []).append(day)
        found = sorted(month_files | set(self.days))
        if not found:
            raise FileNotFoundError(f"no event database months (or days) under {events_dir}")
        self.months = found
        self.start = found[0]
        self._loaded: list[tuple[pl.DataFrame, pl.DataFrame]] = []
        # The parts sandbox children map (gated_files); removed with this object.
        self.table_files = TableFiles()

    @property
    def last_day(self) -> date:
        last = self.months[-1]
        return self.days[last][-1] if last in self.days else month_end(last)

    def _month(self, i: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        while len(self._loaded) <= i:
            month = self.months[len(self._loaded)]
            offset = sum(news.height for _, news in self._loaded)
            if month in self.days:
                self._loaded.append(self._days_of(month, offset))
                continue
            # Sealed months are checked once, as they are cached (~1 ms per MB; a downloaded
            # release has no digests: `mirai download` checked it against its manifest).
            events, news = verified(
                self.layout, self.layout.database_path("events", month), self.layout.database_path("news", month)
            )
            # The files may come from a release anyone handed over (docs/evaluate-your-agent.md):
            # a bad one stops the run with one line naming it, and cannot widen the gate.
            try:
                prepared = _prepare_month(
                    _read_month(events, "events", self.untrusted_files),
                    _read_month(news, "news", self.untrusted_files),
                    offset,
                )
            except (OSError, pl.exceptions.PolarsError) as exc:
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                raise DatabaseFileError(
                    f"{events} or {news}: cannot be read as a database month ({type(exc).__name__}: {first}); refused"
                ) from None
            for frame, path in zip(prepared, (events, news), strict=True):
                _check_dates(frame, month, month_end(month), f"{month:%Y-%m}", path)
            self._loaded.append(prepared)
        return self._loaded[i]

    def _days_of(self, month: date, offset: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A month given as day files, in the layout of a month's: each day's rows checked to be of
        its day, then the days prepared together (an event's articles are of its own day)."""
        tables: dict[str, list[pl.LazyFrame]] = {"events": [], "news": []}
        for day in self.days[month]:
            for table, frames in tables.items():
                path = self.layout.database_dir() / table / f"day={day.isoformat()}.parquet"
                try:
                    frame = _read_month(path, table, self.untrusted_files).select(list(STORED_TYPES[table]))
                    _check_dates(frame.select("date").collect(), day, day, day.isoformat(), path)
                except (OSError, pl.exceptions.PolarsError) as exc:
                    raise DatabaseFileError(
                        f"{path}: cannot be read as a database day ({type(exc).__name__}); refused"
                    ) from None
                frames.append(frame)
        try:
            return _prepare_month(pl.concat(tables["events"]), pl.concat(tables["news"]), offset)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise DatabaseFileError(
                f"the day files of {month:%Y-%m} cannot be read as a database month ({type(exc).__name__}); refused"
            ) from None

    def _gated_parts(self, cutoff: date) -> list[tuple[str, Callable[[], tuple[pl.DataFrame, pl.DataFrame]]]]:
        """(name, build) per part of the gated tables for ``cutoff``: each month before the cutoff
        month whole, the cutoff month up to the cutoff. Later months are not read. A cutoff before
        the database starts (a query in its first days) sees nothing: empty tables of the right
        schema."""
        last = max(month_start(cutoff), self.start)
        indices = [i for i, month in enumerate(self.months) if month <= last]

        def upto(i: int) -> tuple[pl.DataFrame, pl.DataFrame]:
            # Only the newest month of a cutoff can hold days after it.
            events, news = self._month(i)
            return events.filter(pl.col("date") <= cutoff), news.filter(pl.col("date") <= cutoff)

        parts = [(f"month={self.months[i]:%Y-%m}", functools.partial(self._month, i)) for i in indices[:-1]]
        return [*parts, (f"upto={cutoff.isoformat()}", functools.partial(upto, indices[-1]))]

    def gated_tables(self, cutoff: date) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Events and news dated on or before ``cutoff`` (the parts of ``_gated_parts``, in memory)."""
        frames = [build() for _, build in self._gated_parts(cutoff)]
        return pl.concat([e for e, _ in frames], rechunk=False), pl.concat([n for _, n in frames], rechunk=False)

    def gated_files(self, cutoff: date) -> list[tuple[Path, Path]]:
        """The gated tables for ``cutoff`` as read-only Arrow files, one (events, news) pair per
        part, each written once per database and shared by every sandbox child that needs it
        (table_files.py); the file of the cutoff month's part holds no row after the cutoff."""
        return [self.table_files.part(name, build) for name, build in self._gated_parts(cutoff)]

    def environment(
        self,
        query_date: date,
        distance_days: int = 1,
        *,
        tools: str = "full",
        count_both_actors: bool = False,
        dialect: str = "native",
        code_libraries: tuple[str, ...] | None = None,
        memory_mb: int | None = None,
    ) -> Environment:
        """The query's Environment; ``tools``, ``count_both_actors``, ``dialect``,
        ``code_libraries`` and ``memory_mb`` as in Environment (``code_libraries`` None: the database's own)."""
        if distance_days < 1:
            raise ValueError(
                f"distance_days must be at least 1 (the query day itself is never visible), got {distance_days}"
            )
        cutoff = query_date - timedelta(days=distance_days)
        events, news = self.gated_tables(cutoff)
        return Environment(
            events,
            news,
            start=self.start,
            cutoff=cutoff,
            query_date=query_date,
            distance_days=distance_days,
            allow_unconfined_sandbox=self.allow_unconfined_sandbox,
            sandbox_handover_grid_s=self.sandbox_handover_grid_s,
            tools=tools,
            count_both_actors=count_both_actors,
            dialect=dialect,
            code_libraries=self.code_libraries if code_libraries is None else code_libraries,
            memory_mb=memory_mb,
            table_files=functools.partial(self.gated_files, cutoff),
        )


def open_environment(data_dir: Path | str, query_date: date, distance_days: int = 1) -> Environment:
    """An environment for one query on ``query_date``: it sees events and news up to
    ``query_date - distance_days``. For many queries, keep one ``EventDatabase(data_dir)`` and call
    its ``environment`` method."""
    return EventDatabase(data_dir).environment(query_date, distance_days)
