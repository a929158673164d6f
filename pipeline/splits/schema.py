"""The test split's version, and what its queries look like: QUERIES_SCHEMA is defined with the
other tables a release publishes (pipeline/release/tables.py) and read from here by the split
builder, MIRAI's file layout and the evaluation."""

from pipeline.release.tables import QUERIES_SCHEMA

__all__ = ["QUERIES_SCHEMA", "SPLIT_VERSION"]

SPLIT_VERSION = "split-v1"
