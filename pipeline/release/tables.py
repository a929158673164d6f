"""The tables a release publishes, column by column: the one definition that the split builder
(queries, pipeline/splits/split.py), the event database (pipeline/splits/database.py), the agent
API, MIRAI's file layout and each release's Croissant metadata (pipeline/release/croissant.py) read.
Kept here, below pipeline.splits, so that publishing can describe the files without importing the
stage that writes them (a leaf module: it imports no other stage, only pipeline.columns).
"""

import polars as pl

from pipeline.columns import Columns

# GDELT's terms of use, which every release (its card, its Croissant metadata) links as its licence.
GDELT_TERMS = "https://www.gdeltproject.org/about.html#termsfuse"

QUERIES_COLUMNS = Columns(
    {
        "query_id": (pl.String, 'Identifier "YYYY-MM-NNNNN", numbered in (date, s, o) order'),
        "date": (pl.Date, "Day t the query asks about (UTC)"),
        "s": (pl.String, "Subject country, ISO 3166-1 alpha-3 (XKX for Kosovo)"),
        "o": (pl.String, "Object country, ISO 3166-1 alpha-3"),
        "s_name": (pl.String, "Subject country name"),
        "o_name": (pl.String, "Object country name"),
        "s_region": (pl.String, "Subject country's region"),
        "o_region": (pl.String, "Object country's region"),
        "query_code": (pl.String, 'The query as MIRAI writes it, e.g. "(2024-01-03, USA, ?, CHN)"'),
        "answer_list": (
            pl.List(pl.String),
            "Sorted unique CAMEO level-2 codes s took toward o on day t (the label)",
        ),
        "answer_level1": (pl.List(pl.String), "Sorted unique CAMEO level-1 codes of answer_list"),
        "answer_dict": (
            pl.String,
            'JSON {"01": ["010", "013"], ...}: level-2 codes under their level-1 code, MIRAI\'s answer format',
        ),
        "daily_mentions": (pl.Int64, "GDELT mentions summed over the query's quads in the event database"),
        "n_articles": (pl.UInt32, "Distinct kept articles over the query's quads"),
        "min_articles": (pl.UInt32, "Fewest kept articles of any test-grade quad of the query"),
    }
)
QUERIES_SCHEMA = QUERIES_COLUMNS.schema

EVENT_DB_COLUMNS = Columns(
    {
        "date": (pl.Date, "Day of the quad's events (GDELT's DATEADDED day, equal to SQLDATE)"),
        "s": (pl.String, "Subject country, ISO 3166-1 alpha-3 (XKX for Kosovo)"),
        "r": (pl.String, 'Relation, a CAMEO level-2 code (GDELT\'s EventBaseCode), e.g. "042"'),
        "o": (pl.String, "Object country, ISO 3166-1 alpha-3 (XKX for Kosovo)"),
        "r1": (pl.String, 'CAMEO level-1 code of r, e.g. "04"'),
        "s_name": (pl.String, "Subject country name"),
        "o_name": (pl.String, "Object country name"),
        "r_name": (pl.String, "CAMEO name of relation r"),
        "daily_mentions": (pl.Int64, "GDELT's NumMentions summed over the quad's events that day"),
        "n_articles": (pl.UInt32, "Length of article_ids"),
        "article_ids": (
            pl.List(pl.String),
            "Sorted unique article_ids (news table) of the kept articles reporting the quad",
        ),
    }
)
EVENT_DB_SCHEMA = EVENT_DB_COLUMNS.schema

NEWS_DB_COLUMNS = Columns(
    {
        "article_id": (pl.String, "md5 of the article's normalised URL"),
        "date": (pl.Date, "Day of the events that selected the article (the event table's date)"),
        "url": (pl.String, "The article's normalised URL (from GDELT's SOURCEURL)"),
        "title": (pl.String, "Title extracted from the page"),
        "text": (pl.String, 'Paragraphs that survived the filters, "\\n"-separated'),
        "abstract": (pl.String, "Title, then leading paragraphs until over 50 characters (MIRAI's abstract)"),
    }
)
NEWS_DB_SCHEMA = NEWS_DB_COLUMNS.schema
