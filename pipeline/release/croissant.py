"""A release's ``croissant.json``: its Croissant metadata (MLCommons' JSON-LD vocabulary for ML
datasets, http://mlcommons.org/croissant/1.1), which dataset search engines and loaders read.

Every file of the release is a FileObject (its path as a relative contentUrl, its sha256 and size,
as the manifest lists them), and each table a RecordSet whose fields are the columns of the schema
the pipeline writes the table with (pipeline/release/tables.py). A database table spans one file
per month, so its records come from a FileSet over those files. Like the manifest it is a pure
function of the release's files, so re-planning an unchanged month gives the same bytes.
"""

from __future__ import annotations

import json

import polars as pl

from pipeline.release.layout import DATABASE_TABLES, SPLIT_FILES
from pipeline.release.tables import EVENT_DB_SCHEMA, GDELT_TERMS, NEWS_DB_SCHEMA, QUERIES_SCHEMA

CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
# The JSON-LD context of Croissant 1.1, as the reference library (mlcroissant) writes it.
CONTEXT = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "arrayShape": "cr:arrayShape",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "description": {"@container": "@language"},
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileObject": "cr:fileObject",
    "fileProperty": "cr:fileProperty",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "name": {"@container": "@language"},
    "parentField": "cr:parentField",
    "path": "cr:path",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
# Croissant's name for parquet (mlcroissant reads files of this encodingFormat as parquet).
PARQUET = "application/x-parquet"
TABLE_SCHEMAS = {
    "queries": QUERIES_SCHEMA,
    "queries_sample": QUERIES_SCHEMA,
    "events": EVENT_DB_SCHEMA,
    "news": NEWS_DB_SCHEMA,
}
DATA_TYPES = {
    pl.String: "sc:Text",
    pl.Date: "sc:Date",
    pl.Int64: "cr:Int64",
    pl.UInt32: "cr:UInt32",
}
CITATION = (
    "@article{ye2024mirai, title = {MIRAI: Evaluating LLM Agents for Event Forecasting}, "
    "author = {Ye, Chenchen and others}, journal = {arXiv preprint arXiv:2407.01231}, year = {2024}}"
)


def _field(table: str, column: str, dtype: pl.DataType, source: dict) -> dict:
    inner = dtype.inner if isinstance(dtype, pl.List) else dtype
    if inner not in DATA_TYPES:
        raise ValueError(f"{table}.{column}: no Croissant data type for {dtype}")
    return {
        "@type": "cr:Field",
        "@id": f"{table}/{column}",
        "name": column,
        "dataType": DATA_TYPES[inner],
        "source": {**source, "extract": {"column": column}},
        **({"isArray": True} if isinstance(dtype, pl.List) else {}),
    }


def croissant_metadata(month: str, source: object, files: dict[str, dict]) -> dict:
    """The Croissant metadata of release ``month``: ``files`` is the manifest's {name: {"sha256",
    "bytes", "content_type"}} of every other file, ``source`` the split's record of its data."""
    generated = isinstance(source, dict) and source.get("generated")
    distribution: list[dict] = [
        {
            "@type": "cr:FileObject",
            "@id": name,
            "name": name,
            "contentUrl": name,
            "contentSize": f"{meta['bytes']} B",
            "encodingFormat": PARQUET if name.endswith(".parquet") else meta["content_type"].split(";")[0],
            "sha256": meta["sha256"],
        }
        for name, meta in sorted(files.items())
    ]
    sources = {name.removesuffix(".parquet"): {"fileObject": {"@id": name}} for name in SPLIT_FILES}
    for table in DATABASE_TABLES:
        distribution.append(
            {
                "@type": "cr:FileSet",
                "@id": f"database-{table}",
                "name": f"database-{table}",
                "description": f"The {table} table, one parquet file per month up to {month}.",
                "encodingFormat": PARQUET,
                "includes": f"database/{table}/*.parquet",
            }
        )
        sources[table] = {"fileSet": {"@id": f"database-{table}"}}
    record_sets = [
        {
            "@type": "cr:RecordSet",
            "@id": table,
            "name": table,
            "field": [_field(table, column, dtype, sources[table]) for column, dtype in TABLE_SCHEMAS[table].items()],
        }
        for table in sources
    ]
    origin = (
        f"GENERATED data, not GDELT ({source.get('description', 'generated data')})"
        if generated
        else "rebuilt from the GDELT 2.0 event feed"
    )
    return {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CONFORMS_TO,
        "name": f"mirai-{month}",
        "description": (
            f"MIRAI test split {month}, {origin}: forecasting queries (t, s, ?, o) on the CAMEO relations "
            f"between countries, with the event and news database an agent may search (every month up to {month})."
        ),
        "license": GDELT_TERMS,
        "url": "https://arxiv.org/abs/2407.01231",
        # A release is never rewritten (docs/releases.md): each month's dataset has one version.
        "version": "1.0.0",
        "citeAs": CITATION,
        "keywords": [
            "forecasting",
            "event-forecasting",
            "gdelt",
            "cameo",
            "mirai",
            *(["synthetic"] if generated else []),
        ],
        "distribution": distribution,
        "recordSet": record_sets,
    }


def croissant_bytes(month: str, source: object, files: dict[str, dict]) -> bytes:
    return (json.dumps(croissant_metadata(month, source, files), indent=2, sort_keys=True) + "\n").encode()
