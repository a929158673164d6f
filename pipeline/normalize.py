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
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline.reference.tables import (
    COUNTRY_TABLE_VERSION,
    RELATION_TABLE_VERSION,
    cameo_to_iso3,
    country_table,
    level2_codes,
)

RULES_VERSION = "rules-v1"
# polars' hash is stable within one polars version only, so stored URL hashes carry this tag and
# are rebuilt when it changes (see pipeline.history).
URL_HASH_SEED = 20230101

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

EVENTS_SCHEMA = pl.Schema(
    [
        ("event_id", pl.Int64),
        ("date", pl.Date),
        ("s", pl.String),
        ("r", pl.String),
        ("o", pl.String),
        ("r1", pl.String),
        ("s_cameo", pl.String),
        ("o_cameo", pl.String),
        ("event_code", pl.String),
        ("quad_class", pl.Int8),
        ("goldstein", pl.Float64),
        ("num_mentions", pl.Int32),
        ("num_sources", pl.Int32),
        ("num_articles", pl.Int32),
        ("avg_tone", pl.Float64),
        ("date_added", pl.Datetime("us", "UTC")),
        ("url", pl.String),
    ]
)

INPUT_COLUMNS = (
    "GLOBALEVENTID", "SQLDATE", "Actor1CountryCode", "Actor2CountryCode", "EventCode", "EventBaseCode",
    "QuadClass", "GoldsteinScale", "NumMentions", "NumSources", "NumArticles", "AvgTone", "DATEADDED", "SOURCEURL",
)


def url_hash(column: str | pl.Expr = "url") -> pl.Expr:
    expr = pl.col(column) if isinstance(column, str) else column
    return expr.hash(seed=URL_HASH_SEED)


@dataclass(frozen=True)
class History:
    """What was ingested before the rows being normalised: event ids already seen and the first
    publication day of every URL already seen (by hash)."""

    event_ids: pl.LazyFrame  # event_id: Int64, unique
    url_first_day: pl.LazyFrame  # url_hash: UInt64, first_day: Date; unique url_hash

    @classmethod
    def empty(cls) -> "History":
        return cls(
            pl.LazyFrame(schema={"event_id": pl.Int64}),
            pl.LazyFrame(schema={"url_hash": pl.UInt64, "first_day": pl.Date}),
        )


@dataclass(frozen=True)
class Normalized:
    events: pl.DataFrame  # EVENTS_SCHEMA, sorted by (date_added, event_id)
    exclusions: dict[str, int]  # every reason in EXCLUSIONS, zeros included
    unmapped_codes: pl.DataFrame  # code, rows: actor country codes the table does not know
    input_rows: int

    @property
    def metadata(self) -> dict[str, str]:
        return {
            "rules_version": RULES_VERSION,
            "country_table_version": COUNTRY_TABLE_VERSION,
            "relation_table_version": RELATION_TABLE_VERSION,
        }


def _flagged(rows: pl.LazyFrame, history: History) -> pl.LazyFrame:
    """Every input row with its first failing rule in ``exclusion`` (null = kept)."""
    table = country_table().lazy().select(pl.col("cameo_code"), pl.col("status"))
    iso = cameo_to_iso3().lazy()
    level2 = pl.Series(sorted(level2_codes()), dtype=pl.String).implode()

    def actor(side: str, code_col: str) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        return (
            iso.select(pl.col("cameo_code").alias(code_col), pl.col("iso3").alias(side)),
            table.select(pl.col("cameo_code").alias(code_col), pl.col("status").alias(f"{side}_status")),
        )

    s_iso, s_status = actor("s", "Actor1CountryCode")
    o_iso, o_status = actor("o", "Actor2CountryCode")
    seen_ids = history.event_ids.select("event_id", pl.lit(True).alias("id_seen_before"))

    lf = (
        rows.select(INPUT_COLUMNS)
        .with_row_index("_order")
        .with_columns(
            pl.col("DATEADDED").dt.date().alias("pub_day"),
            url_hash("SOURCEURL").alias("url_hash"),
        )
        # Rule 6 comes before every other rule: the first day over all rows carrying the URL.
        .with_columns(pl.col("pub_day").min().over("url_hash").alias("first_day_here"))
        .join(history.url_first_day, on="url_hash", how="left")
        .join(seen_ids, left_on="GLOBALEVENTID", right_on="event_id", how="left")
        .join(s_iso, on="Actor1CountryCode", how="left")
        .join(o_iso, on="Actor2CountryCode", how="left")
        .join(s_status, on="Actor1CountryCode", how="left")
        .join(o_status, on="Actor2CountryCode", how="left")
        # Joins may reorder rows; the earliest copy of a duplicated id must be the one kept.
        .sort("DATEADDED", "_order")
    )
    first_day = pl.min_horizontal("first_day_here", "first_day")
    blank = pl.col("Actor1CountryCode").is_null() | pl.col("Actor2CountryCode").is_null()
    not_country = (pl.col("s_status") == "excluded") | (pl.col("o_status") == "excluded")
    unknown = pl.col("s_status").is_null() | pl.col("o_status").is_null()
    duplicate = pl.col("id_seen_before").fill_null(False) | ~pl.col("GLOBALEVENTID").is_first_distinct()
    reason = (
        pl.when(duplicate).then(pl.lit("duplicate_event_id"))
        .when(pl.col("SOURCEURL").is_not_null() & (pl.col("pub_day") > first_day)).then(pl.lit("url_reported_earlier"))
        .when(pl.col("SQLDATE") != pl.col("pub_day")).then(pl.lit("date_not_aligned"))
        .when(blank).then(pl.lit("actor_blank"))
        .when(not_country).then(pl.lit("actor_not_a_country"))
        .when(unknown).then(pl.lit("actor_unknown_code"))
        .when(pl.col("s") == pl.col("o")).then(pl.lit("domestic"))
        .when(~pl.col("EventBaseCode").is_in(level2)).then(pl.lit("invalid_relation"))
    )
    return lf.with_columns(reason.alias("exclusion"))


def _events(flagged: pl.LazyFrame) -> pl.LazyFrame:
    return (
        flagged.filter(pl.col("exclusion").is_null())
        .select(
            pl.col("GLOBALEVENTID").alias("event_id"),
            pl.col("pub_day").alias("date"),
            "s",
            pl.col("EventBaseCode").alias("r"),
            "o",
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
        .sort("date_added", "event_id")
    )


def normalize_with_report(rows: pl.DataFrame | pl.LazyFrame, history: History | None = None) -> Normalized:
    """Apply the rules to parsed export rows (any number of days) given what came before."""
    flagged = _flagged(rows.lazy(), history or History.empty())
    events, counts, total = pl.collect_all(
        [
            _events(flagged),
            flagged.group_by("exclusion").len(),
            flagged.select(pl.len()),
        ]
    )
    by_reason = {reason: n for reason, n in counts.iter_rows() if reason is not None}
    return Normalized(
        events=events.match_to_schema(EVENTS_SCHEMA),
        exclusions={reason: int(by_reason.get(reason, 0)) for reason in EXCLUSIONS},
        unmapped_codes=unmapped_codes(rows),
        input_rows=int(total.item()),
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
    )


QUADS_SCHEMA = pl.Schema(
    [
        ("date", pl.Date),
        ("s", pl.String),
        ("r", pl.String),
        ("o", pl.String),
        ("r1", pl.String),
        ("daily_mentions", pl.Int64),
        ("n_events", pl.UInt32),
        ("urls", pl.List(pl.String)),
        ("n_urls", pl.UInt32),
        ("web_mention_urls", pl.UInt32),
    ]
)


def daily_quads(events: pl.DataFrame | pl.LazyFrame, mentions: pl.DataFrame | pl.LazyFrame | None = None) -> pl.DataFrame:
    """One row per (date, s, r, o): daily_mentions = sum of NumMentions over its events, the
    event count, the sorted article URLs, and (from the mentions table) the number of distinct
    WEB mention URLs seen on the event's own day, more sources per event than MIRAI used."""
    ev = events.lazy()
    quads = ev.group_by("date", "s", "r", "o").agg(
        pl.col("r1").first(),
        pl.col("num_mentions").sum().cast(pl.Int64).alias("daily_mentions"),
        pl.len().alias("n_events"),
        pl.col("url").drop_nulls().unique().sort().alias("urls"),
    )
    if mentions is None:
        web = ev.select("date", "s", "r", "o").unique().with_columns(pl.lit(0, pl.UInt32).alias("web_mention_urls"))
    else:
        first_day_web = (
            mentions.lazy()
            .filter(pl.col("MentionType") == 1)
            .select(pl.col("GLOBALEVENTID").alias("event_id"), pl.col("MentionTimeDate").dt.date().alias("mention_day"),
                    pl.col("MentionIdentifier").alias("mention_url"))
        )
        web = (
            ev.select("event_id", "date", "s", "r", "o")
            .join(first_day_web, on="event_id", how="inner")
            .filter(pl.col("mention_day") == pl.col("date"))
            .group_by("date", "s", "r", "o")
            .agg(pl.col("mention_url").n_unique().cast(pl.UInt32).alias("web_mention_urls"))
        )
    return (
        quads.join(web, on=["date", "s", "r", "o"], how="left")
        .with_columns(
            pl.col("urls").list.len().alias("n_urls"),
            pl.col("web_mention_urls").fill_null(0),
        )
        .select(QUADS_SCHEMA.names())
        .sort("date", "s", "r", "o")
        .collect()
        .match_to_schema(QUADS_SCHEMA)
    )
