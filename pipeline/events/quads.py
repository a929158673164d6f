"""Daily quads: the normalised events of a day grouped by (date, s, r, o), with their mentions,
article URLs and the WEB sources the mentions table adds; the table the event database and the
article selection read (``QUADS_SCHEMA``).
"""

from __future__ import annotations

import polars as pl

from pipeline.columns import Columns

QUADS_COLUMNS = Columns(
    {
        "date": (pl.Date, "Day of the quad's events (the events table's date)"),
        "s": (pl.String, "Subject country, ISO 3166-1 alpha-3"),
        "r": (pl.String, "Relation, a CAMEO level-2 code (GDELT's EventBaseCode)"),
        "o": (pl.String, "Object country, ISO 3166-1 alpha-3"),
        "r1": (pl.String, "CAMEO level-1 code of r"),
        "daily_mentions": (pl.Int64, "GDELT's NumMentions summed over the quad's events"),
        "n_events": (pl.UInt32, "Kept events of the quad"),
        "urls": (pl.List(pl.String), "Distinct SOURCEURLs of the quad's events, sorted"),
        "n_urls": (pl.UInt32, "Length of urls"),
        "web_mention_urls": (
            pl.UInt32,
            "Distinct WEB MentionIdentifiers of the events (GDELT mentions table) seen on the quad's day",
        ),
    }
)
QUADS_SCHEMA = QUADS_COLUMNS.schema


def daily_quads(
    events: pl.DataFrame | pl.LazyFrame, mentions: pl.DataFrame | pl.LazyFrame | None = None
) -> pl.DataFrame:
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
            .select(
                pl.col("GLOBALEVENTID").alias("event_id"),
                pl.col("MentionTimeDate").dt.date().alias("mention_day"),
                pl.col("MentionIdentifier").alias("mention_url"),
            )
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
