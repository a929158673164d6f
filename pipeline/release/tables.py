"""The tables a release publishes, column by column: the one definition that the split builder
(queries, pipeline/splits/split.py), the event database (pipeline/splits/database.py), the agent
API, MIRAI's file layout and each release's Croissant metadata (pipeline/release/croissant.py) read.
Kept here, below pipeline.splits, so that publishing can describe the files without importing the
stage that writes them (a leaf module: it imports no other stage).
"""

import polars as pl

# GDELT's terms of use, which every release (its card, its Croissant metadata) links as its licence.
GDELT_TERMS = "https://www.gdeltproject.org/about.html#termsfuse"

QUERIES_SCHEMA = pl.Schema(
    [
        ("query_id", pl.String),  # "YYYY-MM-NNNNN", numbered in (date, s, o) order
        ("date", pl.Date),
        ("s", pl.String),
        ("o", pl.String),
        ("s_name", pl.String),
        ("o_name", pl.String),
        ("s_region", pl.String),
        ("o_region", pl.String),
        ("query_code", pl.String),  # "(2024-01-03, USA, ?, CHN)"
        ("answer_list", pl.List(pl.String)),  # sorted unique level-2 codes
        ("answer_level1", pl.List(pl.String)),  # sorted unique level-1 codes
        ("answer_dict", pl.String),  # JSON {"01": ["010", "013"], ...}, keys and lists sorted
        ("daily_mentions", pl.Int64),  # summed over the query's quads in the event database
        ("n_articles", pl.UInt32),  # distinct kept articles over those quads
        ("min_articles", pl.UInt32),  # fewest kept articles of any test-grade quad of the query
    ]
)

EVENT_DB_SCHEMA = pl.Schema(
    [
        ("date", pl.Date),
        ("s", pl.String),  # ISO 3166-1 alpha-3 (or XKX)
        ("r", pl.String),  # CAMEO level-2 code, e.g. "042"
        ("o", pl.String),
        ("r1", pl.String),  # CAMEO level-1 code, e.g. "04"
        ("s_name", pl.String),
        ("o_name", pl.String),
        ("r_name", pl.String),
        ("daily_mentions", pl.Int64),
        ("n_articles", pl.UInt32),
        ("article_ids", pl.List(pl.String)),  # sorted, unique
    ]
)

NEWS_DB_SCHEMA = pl.Schema(
    [
        ("article_id", pl.String),  # md5 of the normalised URL
        ("date", pl.Date),  # publication day
        ("url", pl.String),
        ("title", pl.String),
        ("text", pl.String),  # paragraphs that survived the filters, "\n"-separated
        ("abstract", pl.String),
    ]
)
