"""Column layouts of the GDELT 2.0 raw files, with the types we store them as.

Names follow GDELT's own header files (Event Codebook V2.0; gdeltPyR's copies in
github.com/linwoodc3/gdeltPyR ``utils/schema_csvs/``). CAMEO and FIPS codes stay strings because of
their leading zeros (``043``, ``0211``); FeatureID stays a string because it holds text such as
``US`` or ``NY`` for country/ADM1 matches.
"""

from __future__ import annotations

import polars as pl

from pipeline.columns import Columns

SQL_DATE = pl.Date  # parsed from YYYYMMDD
TIMESTAMP = pl.Datetime("us", "UTC")  # parsed from YYYYMMDDHHMMSS, UTC per the codebook


ACTOR_ROLES = {"Actor1": "the first actor (the one acting)", "Actor2": "the second actor (the one acted upon)"}
GEO_ROLES = {"Actor1Geo": "Actor1's location", "Actor2Geo": "Actor2's location", "ActionGeo": "the action's location"}


def _actor(prefix: str) -> dict[str, tuple[pl.DataType, str]]:
    role = ACTOR_ROLES[prefix]
    return {
        f"{prefix}Code": (pl.String, f"GDELT's {prefix}Code: the full CAMEO code of {role}"),
        f"{prefix}Name": (pl.String, f"GDELT's {prefix}Name: the name of {role}"),
        f"{prefix}CountryCode": (pl.String, f"GDELT's {prefix}CountryCode: CAMEO country code of {role}"),
        f"{prefix}KnownGroupCode": (pl.String, f"GDELT's {prefix}KnownGroupCode: CAMEO known group (IGO, NGO, …)"),
        f"{prefix}EthnicCode": (pl.String, f"GDELT's {prefix}EthnicCode: CAMEO ethnic code"),
        f"{prefix}Religion1Code": (pl.String, f"GDELT's {prefix}Religion1Code: CAMEO religion code"),
        f"{prefix}Religion2Code": (pl.String, f"GDELT's {prefix}Religion2Code: second CAMEO religion code"),
        f"{prefix}Type1Code": (pl.String, f"GDELT's {prefix}Type1Code: CAMEO actor type (GOV, MIL, …)"),
        f"{prefix}Type2Code": (pl.String, f"GDELT's {prefix}Type2Code: second CAMEO actor type"),
        f"{prefix}Type3Code": (pl.String, f"GDELT's {prefix}Type3Code: third CAMEO actor type"),
    }


def _geo(prefix: str) -> dict[str, tuple[pl.DataType, str]]:
    place = GEO_ROLES[prefix]
    return {
        f"{prefix}_Type": (pl.Int8, f"GDELT's {prefix}_Type: resolution of {place} (1 country … 5 world city)"),
        f"{prefix}_FullName": (pl.String, f"GDELT's {prefix}_FullName: {place} as a name"),
        f"{prefix}_CountryCode": (pl.String, f"GDELT's {prefix}_CountryCode: FIPS 10-4 country of {place}"),
        f"{prefix}_ADM1Code": (pl.String, f"GDELT's {prefix}_ADM1Code: FIPS country and ADM1 of {place}"),
        f"{prefix}_ADM2Code": (pl.String, f"GDELT's {prefix}_ADM2Code: ADM2 (county, district) of {place}"),
        f"{prefix}_Lat": (pl.Float64, f"GDELT's {prefix}_Lat: latitude of {place}"),
        f"{prefix}_Long": (pl.Float64, f"GDELT's {prefix}_Long: longitude of {place}"),
        f"{prefix}_FeatureID": (pl.String, f"GDELT's {prefix}_FeatureID: GNS/GNIS feature id, or a country/ADM1 code"),
    }


# Descriptions after GDELT's Event Codebook V2.0 (http://data.gdeltproject.org/documentation/GDELT-Event_Codebook-V2.0.pdf).
EXPORT_COLUMNS = Columns(
    {
        "GLOBALEVENTID": (pl.Int64, "GDELT's GLOBALEVENTID: the event's unique identifier"),
        "SQLDATE": (SQL_DATE, "GDELT's SQLDATE: the day the event took place"),
        "MonthYear": (pl.Int32, "GDELT's MonthYear: YYYYMM of SQLDATE"),
        "Year": (pl.Int16, "GDELT's Year: YYYY of SQLDATE"),
        "FractionDate": (pl.Float64, "GDELT's FractionDate: SQLDATE as a fraction of the year"),
        **_actor("Actor1"),
        **_actor("Actor2"),
        "IsRootEvent": (pl.Int8, "GDELT's IsRootEvent: 1 if from the article's lead paragraph"),
        "EventCode": (pl.String, "GDELT's EventCode: the full CAMEO action code (e.g. 0431)"),
        "EventBaseCode": (pl.String, "GDELT's EventBaseCode: the CAMEO level-2 code (e.g. 043)"),
        "EventRootCode": (pl.String, "GDELT's EventRootCode: the CAMEO level-1 code (e.g. 04)"),
        "QuadClass": (
            pl.Int8,
            "GDELT's QuadClass: 1 verbal cooperation, 2 material cooperation, 3 verbal conflict, 4 material conflict",
        ),
        "GoldsteinScale": (pl.Float64, "GDELT's GoldsteinScale: theoretical impact of the event type, -10 to +10"),
        "NumMentions": (pl.Int32, "GDELT's NumMentions: mentions of the event in the first 15 minutes"),
        "NumSources": (pl.Int32, "GDELT's NumSources: distinct sources mentioning it in the first 15 minutes"),
        "NumArticles": (pl.Int32, "GDELT's NumArticles: distinct documents mentioning it in the first 15 minutes"),
        "AvgTone": (pl.Float64, "GDELT's AvgTone: mean tone of those documents, -100 to +100"),
        **_geo("Actor1Geo"),
        **_geo("Actor2Geo"),
        **_geo("ActionGeo"),
        "DATEADDED": (TIMESTAMP, "GDELT's DATEADDED: when GDELT added the event (its 15-minute slot, UTC)"),
        "SOURCEURL": (pl.String, "GDELT's SOURCEURL: URL or citation of the first document reporting it"),
    }
)

# Descriptions after GDELT's Event Codebook V2.0, "Mentions table".
MENTIONS_COLUMNS = Columns(
    {
        "GLOBALEVENTID": (pl.Int64, "GDELT's GLOBALEVENTID: the event mentioned (export's GLOBALEVENTID)"),
        "EventTimeDate": (TIMESTAMP, "GDELT's EventTimeDate: the 15-minute slot the event was first seen in"),
        "MentionTimeDate": (TIMESTAMP, "GDELT's MentionTimeDate: the 15-minute slot of this mention"),
        "MentionType": (
            pl.Int8,
            "GDELT's MentionType: 1 WEB, 2 CITATIONONLY, 3 CORE, 4 DTIC, 5 JSTOR, 6 NONTEXTUALSOURCE",
        ),
        "MentionSourceName": (pl.String, "GDELT's MentionSourceName: the source (e.g. its domain)"),
        "MentionIdentifier": (pl.String, "GDELT's MentionIdentifier: the document's URL (for WEB) or citation"),
        "SentenceID": (pl.Int32, "GDELT's SentenceID: the sentence of the document the event was found in"),
        "Actor1CharOffset": (pl.Int32, "GDELT's Actor1CharOffset: character offset of Actor1 in the document"),
        "Actor2CharOffset": (pl.Int32, "GDELT's Actor2CharOffset: character offset of Actor2 in the document"),
        "ActionCharOffset": (pl.Int32, "GDELT's ActionCharOffset: character offset of the action in the document"),
        "InRawText": (pl.Int8, "GDELT's InRawText: 1 if found in the raw text, 0 only after processing"),
        "Confidence": (pl.Int16, "GDELT's Confidence: percent confidence in the extraction, 10 to 100"),
        "MentionDocLen": (pl.Int32, "GDELT's MentionDocLen: the document's length in characters"),
        "MentionDocTone": (pl.Float64, "GDELT's MentionDocTone: the document's tone, -100 to +100"),
        "MentionDocTranslationInfo": (
            pl.String,
            "GDELT's MentionDocTranslationInfo: source language and engine, empty for English",
        ),
        "Extras": (pl.String, "GDELT's Extras: reserved for future fields"),
    }
)

EXPORT_SCHEMA = EXPORT_COLUMNS.schema
MENTIONS_SCHEMA = MENTIONS_COLUMNS.schema
# Each schema by the kind of file it is parsed from (parse.py, lines.py, convert.py share it).
SCHEMAS: dict[str, pl.Schema] = {"export": EXPORT_SCHEMA, "mentions": MENTIONS_SCHEMA}
COLUMNS_BY_KIND: dict[str, Columns] = {"export": EXPORT_COLUMNS, "mentions": MENTIONS_COLUMNS}

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
