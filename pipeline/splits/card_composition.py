"""The Composition section of a split's dataset card (Gebru et al.'s "what do the instances
represent, how many are there"): the numbers of the queries and the sample, answer lengths, quad
classes, the fields and their nulls.

Out of card.py, which assembles the card from its sections, because it is the longest one and
the only one that computes from the query frames rather than reading the manifest.
"""

from __future__ import annotations

import polars as pl

from pipeline.reference.tables import relation_table
from pipeline.release.tables import QUERIES_COLUMNS
from pipeline.splits.card_figures import QUAD_NAMES, quad_counts
from pipeline.splits.card_format import manifest_value, markdown_table, number_text

LONG_ANSWER = 10


def frame_stats(df: pl.DataFrame) -> dict[str, object]:
    """The composition numbers of one query frame (queries or sample)."""
    row = df.select(
        pl.len().alias("queries"),
        pl.concat_list("s", "o").explode().n_unique().alias("countries"),
        pl.struct("s", "o").n_unique().alias("pairs"),
        pl.col("answer_level1").explode().drop_nulls().n_unique().alias("level1"),
        pl.col("answer_list").explode().drop_nulls().n_unique().alias("level2"),
        pl.col("date").min().cast(pl.String).alias("first"),
        pl.col("date").max().cast(pl.String).alias("last"),
        pl.col("date").n_unique().alias("days"),
    ).row(0, named=True)
    return {key: "–" if value is None else value for key, value in row.items()}  # dates of an empty frame


def answer_lengths(df: pl.DataFrame) -> pl.DataFrame:
    """Queries per number of relations in the answer, at level 2 and level 1; lengths from
    LONG_ANSWER up share one row ("10+") so a few huge answers do not stretch the table."""

    def by_length(column: str) -> pl.DataFrame:
        length = pl.col(column).list.len().clip(upper_bound=LONG_ANSWER).alias("relations")
        return df.group_by(length).agg(pl.len().alias(column))

    return (
        by_length("answer_list")
        .join(by_length("answer_level1"), on="relations", how="full", coalesce=True)
        .with_columns(pl.col("answer_list", "answer_level1").fill_null(0))
        .sort("relations")
        .select(
            pl.when(pl.col("relations") == LONG_ANSWER)
            .then(pl.lit(f"{LONG_ANSWER}+"))
            .otherwise(pl.col("relations").cast(pl.String))
            .alias("relations"),
            pl.col("answer_list").alias("level2"),
            pl.col("answer_level1").alias("level1"),
        )
    )


def _length_summary(df: pl.DataFrame) -> str:
    if df.is_empty():
        return "no queries"
    lengths = df.select(pl.col("answer_list").list.len())
    stats = lengths.select(
        pl.all().min().alias("min"),
        pl.all().median().alias("median"),
        pl.all().mean().alias("mean"),
        pl.all().max().alias("max"),
    ).row(0, named=True)
    return f"min {stats['min']}, median {stats['median']:g}, mean {stats['mean']:.2f}, max {stats['max']}"


def _missing_note(queries: pl.DataFrame) -> str:
    nulls = queries.null_count().unpivot(variable_name="field", value_name="nulls").filter(pl.col("nulls") > 0)
    if nulls.is_empty():
        return "No field is null."
    return "Null values: " + ", ".join(f"`{f}` {number_text(n)}" for f, n in nulls.iter_rows()) + "."


def composition_section(manifest: dict, queries: pl.DataFrame, sample: pl.DataFrame) -> str:
    full, sub = frame_stats(queries), frame_stats(sample)
    n_level2 = relation_table().height
    rows = [
        ("queries", number_text(full["queries"]), number_text(sub["queries"])),
        ("distinct countries (s or o)", full["countries"], sub["countries"]),
        ("distinct (s, o) pairs", full["pairs"], sub["pairs"]),
        ("level-1 relations in answers (of 20)", full["level1"], sub["level1"]),
        (f"level-2 relations in answers (of {n_level2})", full["level2"], sub["level2"]),
        ("first date", full["first"], sub["first"]),
        ("last date", full["last"], sub["last"]),
        ("days with queries", full["days"], sub["days"]),
        ("level-2 relations per answer", _length_summary(queries), _length_summary(sample)),
    ]
    database = [
        ("test-grade quads", number_text(manifest_value(manifest, "counts", "test_grade_quads"))),
        ("event database rows (quads)", number_text(manifest_value(manifest, "counts", "database_events"))),
        ("news database articles", number_text(manifest_value(manifest, "counts", "database_articles"))),
    ]
    lengths = answer_lengths(queries)
    quads = quad_counts(queries).with_columns(
        pl.col("mirai_quad_class").replace_strict(QUAD_NAMES, return_dtype=pl.String).alias("name")
    )
    # From the frame: the card describes the file as it was written.
    fields = [
        (f"`{name}`", f"`{dtype}`", QUERIES_COLUMNS.descriptions.get(name, ""))
        for name, dtype in queries.schema.items()
    ]
    return f"""
## Composition

**What do the instances represent?** Each row is one forecasting query `(t, s, ?, o)` about the
month {manifest["month"]}: a day, a subject country and an object country between which GDELT
recorded well-reported events that day. The label is the set of CAMEO level-2 relations `s` took
toward `o` on day `t` (MIRAI's multi-label answer), also given grouped by level-1 code.

**How many instances are there?** `queries.parquet` holds every query of the month;
`queries_sample.parquet` is MIRAI's balanced sample of {number_text(manifest_value(manifest, "sample_size"))} queries
(sampler `{manifest_value(manifest, "sampler_version")}`, seed {manifest_value(manifest, "seed")}), spread over dates,
countries and relation types, for evaluations that cannot afford the full set.

{markdown_table(("", "queries.parquet", "queries_sample.parquet"), rows)}

Agents query a database built from the same pipeline (not part of this split):

{markdown_table(("", "count"), database)}

Queries by number of relations in the answer:

{markdown_table(("relations", "queries (level 2)", "queries (level 1)"), [tuple(r) for r in lengths.iter_rows()])}

Queries whose answer includes each MIRAI quad class (a query can count in several):

{markdown_table(("quad class", "name", "queries"), [tuple(r) for r in quads.select("mirai_quad_class", "name", "queries").iter_rows()])}

Fields:

{markdown_table(("field", "type", "description"), fields)}

**Is any information missing?** {_missing_note(queries)} Article texts are not in the split (see
Distribution); the news database links each event to its article URLs.

**Recommended splits.** This is a test split. For a query on day `t`, an agent sees events and news
dated up to `t` minus the temporal distance ({manifest_value(manifest, "distance_days")} day(s), MIRAI's `l`).
The history cutoff ({manifest_value(manifest, "history_cutoff")}) is the last day before the test month: data up
to it precede every query and can be used freely for training or validation.

**Errors, noise, redundancy.** GDELT codes events automatically from news text, so relations and
actors carry coding errors, and one real-world event can appear under several relations. The
mention thresholds keep widely reported events only, which favours countries with large news
coverage (see the country-pair figure).

**Self-contained?** The split is. The news database it is meant to be used with stores article URLs
and the filtered texts of the articles.

**Confidential or offensive content?** No confidential data: everything comes from public news.
Queries are about states, not people. Relations include conflict (threats, assaults, fighting,
mass violence), which some readers may find distressing.
"""
