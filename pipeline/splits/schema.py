"""What a test split's queries look like: the one definition the split builder, MIRAI's file
layout and the evaluation read (a leaf module: it imports no other stage)."""

import polars as pl

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

SPLIT_VERSION = "split-v1"
