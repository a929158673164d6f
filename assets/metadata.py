"""Metadata helpers shared by the assets."""

import base64
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import polars as pl


def png_metadata(path: Path) -> dg.MetadataValue:
    """A PNG inline in the asset's metadata: the UI renders Markdown images with a data URI, so
    the figure is visible without access to the data directory."""
    encoded = base64.b64encode(path.read_bytes()).decode()
    return dg.MetadataValue.md(f"![{path.stem}](data:image/png;base64,{encoded})")


def table_schema(schema: Mapping[str, pl.DataType]) -> dg.TableSchema:
    """The columns of a frame or parquet file with ``schema`` (a pl.Schema, or a dict of polars
    types) in order, each typed as polars names it (``Datetime(time_unit='us', time_zone='UTC')``)."""
    return dg.TableSchema(columns=[dg.TableColumn(name, str(dtype)) for name, dtype in schema.items()])


# Dagster's key for a table's columns (https://docs.dagster.io/guides/build/assets/metadata-and-tags/table-metadata).
COLUMN_SCHEMA = "dagster/column_schema"


def column_schema(schema: Mapping[str, pl.DataType]) -> dict[str, dg.TableSchema]:
    """``dagster/column_schema`` metadata (the UI's Columns tab; what the column-schema-change
    checks compare between materialisations) for a table written with ``schema``."""
    return {COLUMN_SCHEMA: table_schema(schema)}
