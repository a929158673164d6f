"""Column layouts of the GDELT 2.0 raw files, with the types we store them as.

Names follow GDELT's own header files (Event Codebook V2.0; gdeltPyR's copies in
github.com/linwoodc3/gdeltPyR ``utils/schema_csvs/``). CAMEO and FIPS codes stay strings because of
their leading zeros (``043``, ``0211``); FeatureID stays a string because it holds text such as
``US`` or ``NY`` for country/ADM1 matches.
"""

from __future__ import annotations

import polars as pl

SQL_DATE = pl.Date  # parsed from YYYYMMDD
TIMESTAMP = pl.Datetime("us", "UTC")  # parsed from YYYYMMDDHHMMSS, UTC per the codebook


def _actor(prefix: str) -> list[tuple[str, pl.DataType]]:
    return [
        (f"{prefix}Code", pl.String),
        (f"{prefix}Name", pl.String),
        (f"{prefix}CountryCode", pl.String),
        (f"{prefix}KnownGroupCode", pl.String),
        (f"{prefix}EthnicCode", pl.String),
        (f"{prefix}Religion1Code", pl.String),
        (f"{prefix}Religion2Code", pl.String),
        (f"{prefix}Type1Code", pl.String),
        (f"{prefix}Type2Code", pl.String),
        (f"{prefix}Type3Code", pl.String),
    ]


def _geo(prefix: str) -> list[tuple[str, pl.DataType]]:
    return [
        (f"{prefix}_Type", pl.Int8),
        (f"{prefix}_FullName", pl.String),
        (f"{prefix}_CountryCode", pl.String),  # FIPS 10-4, not ISO
        (f"{prefix}_ADM1Code", pl.String),
        (f"{prefix}_ADM2Code", pl.String),
        (f"{prefix}_Lat", pl.Float64),
        (f"{prefix}_Long", pl.Float64),
        (f"{prefix}_FeatureID", pl.String),
    ]


EXPORT_COLUMNS: list[tuple[str, pl.DataType]] = [
    ("GLOBALEVENTID", pl.Int64),
    ("SQLDATE", SQL_DATE),
    ("MonthYear", pl.Int32),
    ("Year", pl.Int16),
    ("FractionDate", pl.Float64),
    *_actor("Actor1"),
    *_actor("Actor2"),
    ("IsRootEvent", pl.Int8),
    ("EventCode", pl.String),
    ("EventBaseCode", pl.String),
    ("EventRootCode", pl.String),
    ("QuadClass", pl.Int8),
    ("GoldsteinScale", pl.Float64),
    ("NumMentions", pl.Int32),
    ("NumSources", pl.Int32),
    ("NumArticles", pl.Int32),
    ("AvgTone", pl.Float64),
    *_geo("Actor1Geo"),
    *_geo("Actor2Geo"),
    *_geo("ActionGeo"),
    ("DATEADDED", TIMESTAMP),
    ("SOURCEURL", pl.String),
]

MENTIONS_COLUMNS: list[tuple[str, pl.DataType]] = [
    ("GLOBALEVENTID", pl.Int64),
    ("EventTimeDate", TIMESTAMP),
    ("MentionTimeDate", TIMESTAMP),
    ("MentionType", pl.Int8),  # 1 WEB, 2 CITATIONONLY, 3 CORE, 4 DTIC, 5 JSTOR, 6 NONTEXTUALSOURCE
    ("MentionSourceName", pl.String),
    ("MentionIdentifier", pl.String),
    ("SentenceID", pl.Int32),
    ("Actor1CharOffset", pl.Int32),
    ("Actor2CharOffset", pl.Int32),
    ("ActionCharOffset", pl.Int32),
    ("InRawText", pl.Int8),
    ("Confidence", pl.Int16),
    ("MentionDocLen", pl.Int32),
    ("MentionDocTone", pl.Float64),
    ("MentionDocTranslationInfo", pl.String),
    ("Extras", pl.String),
]

EXPORT_SCHEMA = pl.Schema(EXPORT_COLUMNS)
MENTIONS_SCHEMA = pl.Schema(MENTIONS_COLUMNS)
# Each schema by the kind of file it is parsed from (parse.py, lines.py, convert.py share it).
SCHEMAS: dict[str, pl.Schema] = {"export": EXPORT_SCHEMA, "mentions": MENTIONS_SCHEMA}

# Field counts of the formats a GDELT user may hand us by mistake, so a refusal can name them.
KNOWN_FIELD_COUNTS: dict[int, str] = {
    61: "GDELT 2.0 events export",
    16: "GDELT 2.0 mentions",
    27: "GDELT 2.1 GKG",
    58: "GDELT 1.0 daily events (58 columns)",
    57: "GDELT 1.0 historical backfile events (57 columns)",
    11: "GDELT 1.0 GKG",
    15: "GDELT 1.0 GKG counts",
}

REJECTS_SCHEMA = pl.Schema(
    [
        ("file", pl.String),
        ("line_number", pl.Int64),  # 1-based line in the CSV member
        ("reason", pl.String),
        # The line's first 4 KiB as received (parse.REJECT_LINE_BYTES; undecodable bytes kept as
        # they are), its whole length and the sha256 of all of it: a hostile line of hundreds of
        # MB must not be stored whole, yet stays identifiable in its raw zip.
        ("raw_line", pl.Binary),
        ("raw_length", pl.Int64),
        ("raw_sha256", pl.String),
    ]
)
