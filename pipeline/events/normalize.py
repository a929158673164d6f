"""MIRAI's event rules, made exact: from parsed GDELT export rows to the clean international-event
table the benchmark is built on (issue 3; MIRAI's `2_clean_kg.py` with its bugs fixed).

Rules (version ``RULES_VERSION``; recorded in every output's metadata):
1. GLOBALEVENTID is deduplicated across everything ingested: a replayed slot adds nothing.
2. Temporal alignment: the publication day is the UTC day of DATEADDED; an event is kept only
   when SQLDATE equals it (nothing is dated before it was reported).
3. Actor countries: Actor1CountryCode -> s, Actor2CountryCode -> o through the versioned
   CAMEO -> ISO-3166 alpha-3 table (pipeline/reference). Region codes, outdated codes and blanks
   are excluded; a code the table does not know is excluded and reported (schema drift).
4. Domestic events (s == o after mapping) are dropped.
5. The relation r is EventBaseCode and must be one of MIRAI's CAMEO second-level codes; r1 is its
   first two digits.
6. An article URL's publication day is the earliest DATEADDED day of any row carrying it, over all
   history ingested, computed before any other rule; its events are kept on that day only.

Every excluded row is counted under the first rule it fails, in the order of ``EXCLUSIONS``.

The code tables of rules 3 to 5, as integer lookups, are ``code_tables``'s; grouping the kept events
into daily quads is ``quads``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl
import polars_hash as plh

from pipeline.columns import Columns
from pipeline.events.code_tables import EXCLUDED, UNKNOWN, code_lookups
from pipeline.reference.tables import COUNTRY_TABLE_VERSION, RELATION_TABLE_VERSION, country_table

RULES_VERSION = "rules-v1"
# Rule 6 and the stored history keys know a URL by its XXH3-64 hash with this seed: a published
# algorithm (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md), computed by the
# polars-hash plugin. Unlike polars' own `Expr.hash`, its values do not change with the polars
# version, so the stored keys survive polars upgrades (docs/data-layout.md).
URL_HASH_SEED = 20230101
# A null publication day in rule 6's numpy arrays: later than every real day, so never a first
# day while a real one exists, and never late itself (see _url_late).
_NO_DAY = np.iinfo(np.int32).max

EXCLUSIONS = (
    "duplicate_event_id",  # rule 1
    "url_reported_earlier",  # rule 6
    "date_not_aligned",  # rule 2
    "actor_blank",  # rule 3
    "actor_not_a_country",  # rule 3: regions, outdated codes (known, excluded on purpose)
    "actor_unknown_code",  # rule 3: not in the table at all
    "domestic",  # rule 4
    "invalid_relation",  # rule 5: '--', '---' or any code outside the level-2 set
)

EVENTS_COLUMNS = Columns(
    {
        "event_id": (pl.Int64, "GDELT's GLOBALEVENTID"),
        "date": (pl.Date, "Day GDELT added the event (DATEADDED's UTC day), equal to its SQLDATE (rule 2)"),
        "s": (pl.String, "Subject country: Actor1CountryCode as ISO 3166-1 alpha-3 (XKX for Kosovo)"),
        "r": (pl.String, "Relation: GDELT's EventBaseCode, a CAMEO level-2 code (e.g. 042)"),
        "o": (pl.String, "Object country: Actor2CountryCode as ISO 3166-1 alpha-3 (XKX for Kosovo)"),
        "r1": (pl.String, "CAMEO level-1 code of r, its first two digits (e.g. 04)"),
        "s_cameo": (pl.String, "GDELT's Actor1CountryCode (CAMEO country code) as received"),
        "o_cameo": (pl.String, "GDELT's Actor2CountryCode (CAMEO country code) as received"),
        "event_code": (pl.String, "GDELT's EventCode: the full CAMEO action code (e.g. 0421)"),
        "quad_class": (pl.Int8, "GDELT's QuadClass: 1 verbal cooperation … 4 material conflict"),
        "goldstein": (pl.Float64, "GDELT's GoldsteinScale, -10 to +10"),
        "num_mentions": (pl.Int32, "GDELT's NumMentions"),
        "num_sources": (pl.Int32, "GDELT's NumSources"),
        "num_articles": (pl.Int32, "GDELT's NumArticles"),
        "avg_tone": (pl.Float64, "GDELT's AvgTone"),
        "date_added": (pl.Datetime("us", "UTC"), "GDELT's DATEADDED: the 15-minute slot that added the event"),
        "url": (pl.String, "GDELT's SOURCEURL: the first document reporting the event"),
    }
)
EVENTS_SCHEMA = EVENTS_COLUMNS.schema
UNMAPPED_CODES_COLUMNS = Columns(
    {
        "code": (pl.String, "An Actor1CountryCode or Actor2CountryCode the CAMEO→ISO country table lacks"),
        "rows": (pl.Int64, "Rows of the day's GDELT export naming it (as either actor)"),
    }
)
UNMAPPED_CODES_SCHEMA = UNMAPPED_CODES_COLUMNS.schema

INPUT_COLUMNS = (
    "GLOBALEVENTID",
    "SQLDATE",
    "Actor1CountryCode",
    "Actor2CountryCode",
    "EventCode",
    "EventBaseCode",
    "QuadClass",
    "GoldsteinScale",
    "NumMentions",
    "NumSources",
    "NumArticles",
    "AvgTone",
    "DATEADDED",
    "SOURCEURL",
)


def url_hash(column: str = "url") -> pl.Expr:
    """A URL's stable 64-bit key. A null URL gets 0, as rule 6's numpy arrays hold no nulls; its
    rows never count (``has_url``), and a real URL hashing to 0 has odds of 2**-64."""
    return plh.col(column).nchash.xxh3_64(seed=URL_HASH_SEED).fill_null(pl.lit(0, pl.UInt64))


@dataclass(frozen=True)
class History:
    """What was ingested before the rows being normalised: event ids already seen and the first
    publication day of every URL already seen (by hash)."""

    event_ids: pl.LazyFrame  # event_id: Int64, unique
    url_first_day: pl.LazyFrame  # url_hash: UInt64, first_day: Date; unique url_hash

    @classmethod
    def empty(cls) -> History:
        return cls(
            pl.LazyFrame(schema={"event_id": pl.Int64}),
            pl.LazyFrame(schema={"url_hash": pl.UInt64, "first_day": pl.Date}),
        )


@dataclass(frozen=True)
class Normalized:
    events: pl.DataFrame  # EVENTS_SCHEMA, sorted by (date_added, event_id)
    exclusions: dict[str, int]  # every reason in EXCLUSIONS, zeros included
    unmapped_codes: pl.DataFrame  # UNMAPPED_CODES_SCHEMA
    input_rows: int

    @property
    def metadata(self) -> dict[str, str]:
        return {
            "rules_version": RULES_VERSION,
            "country_table_version": COUNTRY_TABLE_VERSION,
            "relation_table_version": RELATION_TABLE_VERSION,
        }


_ACTORS = (("Actor1CountryCode", "s"), ("Actor2CountryCode", "o"))


# Rows per batch of the read (see _read). Smaller batches overlap more of the rules with the read
# but pay more per batch; on the benchmark month 250k and 500k were best, 100k and 1M 4-10 % slower.
BATCH_ROWS = 250_000


@dataclass(frozen=True)
class _Pass:
    keys: pl.DataFrame  # every input row, in order: what rules 1 and 6 need, and row_rule
    candidates: pl.DataFrame  # the rows that rules 2 to 5 keep, all columns; _row = input position
    unknown: pl.DataFrame  # the actor codes the table does not know, of the rows having one


def _read(rows: pl.LazyFrame) -> _Pass:
    """One pass over the input, in batches, deciding rules 2 to 5 as the rows arrive.

    Rules 2 to 5 need one row at a time, so each batch is split while the engine reads the next
    ones: every row keeps only the narrow columns rules 1 and 6 need (``keys``), and the full
    columns are kept only for the rows rules 2 to 5 pass (a quarter of the benchmark month), so
    the input never sits in memory as a whole.
    """
    input_rows = rows.select(INPUT_COLUMNS)
    parts, offset = [], 0
    for batch in _batches(input_rows):
        parts.append(_split(batch, offset))
        offset += batch.height
    if not parts:  # no batch at all: the empty input still gives every output its columns
        parts.append(_split(input_rows.clear().collect(), 0))
    keys, candidates, unknown = (pl.concat(frames) for frames in zip(*parts))
    # Rules 1 and 6 run over the keys as whole columns: one chunk each (cheap, they are narrow).
    return _Pass(keys.rechunk(), candidates, unknown)


def _batches(rows: pl.LazyFrame) -> Iterable[pl.DataFrame]:
    """``rows`` in order, in batches of about ``BATCH_ROWS``.

    ``LazyFrame.collect_batches`` streams them while the caller works on the previous ones, but
    polars 2.1 marks it unstable: where it is missing or its arguments changed (checked here,
    at each call), one ``collect()`` cut with ``iter_slices`` gives the same rows in the same
    order, without the overlap and with the whole input in memory at once (docs/benchmarks.md).
    """
    collect_batches = getattr(rows, "collect_batches", None)
    if collect_batches is not None:
        try:
            return collect_batches(chunk_size=BATCH_ROWS, maintain_order=True)
        except TypeError:  # an incompatible signature; nothing has run yet
            pass
    return rows.collect().iter_slices(BATCH_ROWS)


def _split(batch: pl.DataFrame, offset: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """A batch's part of each ``_Pass`` frame; ``offset`` is the input position of its first row.

    A batch comes as one chunk per input file (a slot file is a few thousand rows), and every
    expression pays a fixed cost per chunk: on the month, a null check cost as much as hashing
    every URL. Copying the batch into one chunk first costs less than two such expressions.
    """
    batch = batch.rechunk()
    row = _row_keys(batch)
    s_id, o_id = row.get_column("s_id"), row.get_column("o_id")
    kept = row.get_column("row_rule").to_numpy() == 0
    candidates = (
        batch.drop("SQLDATE")
        .filter(kept)
        .with_columns(
            pl.Series("_row", np.flatnonzero(kept) + offset, dtype=pl.UInt32),
            row.get_column("pub_day").filter(kept),
            s_id.filter(kept),
            o_id.filter(kept),
        )
    )
    # Codes the table does not know are rare: keep just their rows (most batches have none).
    unknown = [
        (ids.to_numpy() == UNKNOWN) & batch.get_column(code).is_not_null().to_numpy()
        for ids, (code, _) in zip((s_id, o_id), _ACTORS)
    ]
    either = unknown[0] | unknown[1]
    report = batch.select(code for code, _ in _ACTORS).filter(either)
    if report.height:
        report = report.with_columns(
            pl.when(pl.lit(pl.Series(mask[either]))).then(pl.col(code)).alias(code)
            for mask, (code, _) in zip(unknown, _ACTORS)
        )
    return row.drop("s_id", "o_id"), candidates, report


def _row_keys(data: pl.DataFrame) -> pl.DataFrame:
    """Per input row, in order: what rules 1 and 6 need, the country ids, and ``row_rule``.

    Rules 2 to 5 need one row at a time: ``row_rule`` is the number of the first of them a row
    fails (``EXCLUSIONS[row_rule - 1]``; 0 = passes). A missing value fails its rule: a row
    without SQLDATE or DATEADDED is not aligned, one without EventBaseCode has no valid relation.
    """
    lookups = code_lookups()
    s_id = lookups.country.lookup(data.get_column("Actor1CountryCode"))
    o_id = lookups.country.lookup(data.get_column("Actor2CountryCode"))
    relation_ok = lookups.relation.lookup(data.get_column("EventBaseCode"))
    s, o = pl.col("s_id"), pl.col("o_id")
    row_rules = {
        "date_not_aligned": ~(pl.col("SQLDATE") == pl.col("pub_day")).fill_null(False),
        "actor_blank": pl.col("Actor1CountryCode").is_null() | pl.col("Actor2CountryCode").is_null(),
        "actor_not_a_country": (s == EXCLUDED) | (o == EXCLUDED),
        "actor_unknown_code": (s == UNKNOWN) | (o == UNKNOWN),
        "domestic": s == o,
        "invalid_relation": ~pl.col("relation_ok") | pl.col("EventBaseCode").is_null(),
    }
    assert tuple(row_rules) == EXCLUSIONS[EXCLUSIONS.index("date_not_aligned") :]
    row_rule = pl.lit(0, pl.UInt8)
    for reason, failed in reversed(row_rules.items()):
        row_rule = pl.when(failed).then(pl.lit(EXCLUSIONS.index(reason) + 1, pl.UInt8)).otherwise(row_rule)
    # Eager, as everything after the read: the rows are in memory, and a lazy query would run on
    # the streaming engine (polars 2's default), which ran rule 6's window 2x slower.
    return data.with_columns(
        pl.col("DATEADDED").dt.date().alias("pub_day"),
        pl.Series("s_id", s_id),
        pl.Series("o_id", o_id),
        pl.Series("relation_ok", relation_ok),
    ).select(
        "GLOBALEVENTID",
        "DATEADDED",
        "pub_day",
        url_hash("SOURCEURL").alias("url_hash"),
        pl.col("SOURCEURL").is_not_null().alias("has_url"),
        "s_id",
        "o_id",
        row_rule.alias("row_rule"),
    )


def _url_late(keys: pl.DataFrame, url_days: pl.DataFrame) -> pl.Series:
    """Rule 6 for every row: its URL has a first day (over these rows and the history) before
    the row's own day.

    Rows of one URL and one day come in runs (an article's events sit together in a slot file:
    the 5.3M rows of the benchmark month make 2.0M runs), and the first day of a URL is the same
    over its runs as over its rows, so only run starts are looked at. Almost every URL has a
    single run (1.97M URLs for those 2.0M runs), and only a URL with several runs (or one in the
    history) can be late: numpy's sort finds the repeated hashes (its SIMD sort orders 2M u64
    in about 12 ms, polars' window over all runs took 70-100 ms), and the first day is grouped
    over the runs of those URLs only. Nulls behave as in polars: a null day is never late and
    does not count toward a first day.
    """
    n = keys.height
    late = np.zeros(n, dtype=bool)
    if n == 0:
        return pl.Series("late", late)
    hashes = keys.get_column("url_hash").to_numpy()
    days = keys.get_column("pub_day").to_physical().fill_null(_NO_DAY).to_numpy()
    run_start = np.empty(n, dtype=bool)
    run_start[0] = True
    np.not_equal(hashes[1:], hashes[:-1], out=run_start[1:])
    run_start[1:] |= days[1:] != days[:-1]
    starts = np.flatnonzero(run_start)
    run_hash, run_day = hashes[starts], days[starts]
    hist_hash = url_days.get_column("url_hash").to_numpy()
    hist_day = url_days.get_column("first_day").to_physical().fill_null(_NO_DAY).to_numpy()
    ordered = np.sort(run_hash)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    shared = pl.Series(run_hash).is_in(pl.Series(np.concatenate([repeated, hist_hash])).implode()).to_numpy()
    maybe = np.flatnonzero(shared)  # the runs whose URL has another run or a history entry
    if maybe.size == 0:
        return pl.Series("late", late)
    groups = pl.DataFrame(
        {
            "url_hash": np.concatenate([run_hash[maybe], hist_hash]),
            "day": np.concatenate([run_day[maybe], hist_day]),
        }
    )
    late_maybe = (
        groups.select((pl.col("day") > pl.col("day").min().over("url_hash")) & (pl.col("day") != _NO_DAY))
        .to_series()
        .head(maybe.size)
    )
    late_runs = maybe[late_maybe.to_numpy()]
    # Mark the rows of the late runs (a few percent of the runs).
    ends = np.append(starts[1:], n)
    first, length = starts[late_runs], ends[late_runs] - starts[late_runs]
    offsets = np.repeat(first - np.concatenate(([0], np.cumsum(length)[:-1])), length)
    late[offsets + np.arange(length.sum())] = True
    return pl.Series("late", late)


def _exclusions(keys: pl.DataFrame, history: History) -> tuple[pl.Series, bool]:
    """Every row's first failing rule (``EXCLUSIONS[i - 1]``; 0 = kept), in input order; and
    whether the rows came in DATEADDED order with ascending ids, as parsed slot files do."""
    seen_ids, url_days = pl.collect_all(
        [history.event_ids.select("event_id"), history.url_first_day.select("url_hash", "first_day")]
    )
    # Rule 6 comes before every other rule: the first day over all rows carrying the URL.
    late = _url_late(keys, url_days)
    # Rule 1: the earliest copy of an id (by DATEADDED, then input order) is the one kept.
    ids, added = keys.get_column("GLOBALEVENTID"), keys.get_column("DATEADDED")
    in_order = ids.null_count() == 0 and added.null_count() == 0 and added.is_sorted() and ids.is_sorted()
    if in_order:  # the copies of an id are adjacent, and the first of them is the earliest
        first_copy = (pl.col("GLOBALEVENTID") != pl.col("GLOBALEVENTID").shift(1)).fill_null(True)
    else:  # mark the first copies in a stable DATEADDED order, then put the marks back in input order
        by_time = pl.arg_sort_by("DATEADDED", maintain_order=True)
        first_copy = pl.col("GLOBALEVENTID").gather(by_time).is_first_distinct().gather(by_time.arg_sort())
    seen = pl.col("GLOBALEVENTID").is_in(seen_ids.get_column("event_id").implode()).fill_null(False)
    reason = (
        pl.when(seen | ~first_copy)
        .then(pl.lit(EXCLUSIONS.index("duplicate_event_id") + 1, pl.UInt8))
        .when(pl.col("has_url") & pl.lit(late))
        .then(pl.lit(EXCLUSIONS.index("url_reported_earlier") + 1, pl.UInt8))
        .otherwise(pl.col("row_rule"))
    )
    return keys.select(reason.alias("exclusion")).to_series(), in_order


def normalize_with_report(rows: pl.DataFrame | pl.LazyFrame, history: History | None = None) -> Normalized:
    """Apply the rules to parsed export rows (any number of days) given what came before.

    Performance (bench/normalize.py, docs/benchmarks.md): the input is read once, in batches
    that are split while the next ones are read; nothing joins or sorts the wide rows (the small
    tables are applied as integer lookups, rule 6 groups runs of rows instead of rows, rule 1
    sorts only ids and only when the input is out of order), and full columns are kept only for
    rows that can still be kept.
    """
    read = _read(rows.lazy())
    exclusion, in_order = _exclusions(read.keys, history or History.empty())
    countries = pl.lit(code_lookups().countries)
    events = read.candidates.filter(pl.lit(exclusion).gather(pl.col("_row")) == 0).select(
        pl.col("GLOBALEVENTID").alias("event_id"),
        pl.col("pub_day").alias("date"),
        countries.gather(pl.col("s_id")).alias("s"),
        pl.col("EventBaseCode").alias("r"),
        countries.gather(pl.col("o_id")).alias("o"),
        pl.col("EventBaseCode").str.slice(0, 2).alias("r1"),
        pl.col("Actor1CountryCode").alias("s_cameo"),
        pl.col("Actor2CountryCode").alias("o_cameo"),
        pl.col("EventCode").alias("event_code"),
        pl.col("QuadClass").alias("quad_class"),
        pl.col("GoldsteinScale").alias("goldstein"),
        pl.col("NumMentions").alias("num_mentions"),
        pl.col("NumSources").alias("num_sources"),
        pl.col("NumArticles").alias("num_articles"),
        pl.col("AvgTone").alias("avg_tone"),
        pl.col("DATEADDED").alias("date_added"),
        pl.col("SOURCEURL").alias("url"),
    )
    # Kept ids are unique, so (date_added, event_id) orders the events completely; rows that came
    # in DATEADDED order with ascending ids are in that order already.
    if not in_order:
        events = events.sort("date_added", "event_id")
    by_code = np.bincount(exclusion.to_numpy(), minlength=len(EXCLUSIONS) + 1)
    return Normalized(
        events=events.match_to_schema(EVENTS_SCHEMA),
        exclusions={reason: int(by_code[i]) for i, reason in enumerate(EXCLUSIONS, start=1)},
        unmapped_codes=unmapped_codes(read.unknown),
        input_rows=read.keys.height,
    )


def normalize_events(rows: pl.DataFrame | pl.LazyFrame, history: History | None = None) -> pl.DataFrame:
    """The kept events of parsed export rows (``parse_export(...).rows``)."""
    return normalize_with_report(rows, history).events


def unmapped_codes(rows: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Actor country codes the country table does not know, with their row counts: a new CAMEO
    code in GDELT shows up here instead of failing rows."""
    known = country_table().lazy().select(pl.col("cameo_code").alias("code"))
    codes = pl.concat(
        [
            rows.lazy().select(pl.col(c).alias("code")).filter(pl.col("code").is_not_null())
            for c in ("Actor1CountryCode", "Actor2CountryCode")
        ]
    )
    return (
        codes.join(known, on="code", how="anti")
        .group_by("code")
        .agg(pl.len().cast(pl.Int64).alias("rows"))
        .sort("rows", "code", descending=[True, False])
        .collect()
        .match_to_schema(UNMAPPED_CODES_SCHEMA)
    )
