"""Metadata helpers shared by the assets."""

import base64
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import polars as pl

from pipeline.columns import Columns
from pipeline.markdown import visible_text


def png_bytes_metadata(name: str, data: bytes) -> dg.MetadataValue:
    """A PNG inline in the asset's metadata: the UI renders Markdown images with a data URI, so
    the figure is visible without access to the data directory (and one drawn in memory needs no
    file there). ``name``, the image's alt text, is ours, never outside text."""
    encoded = base64.b64encode(data).decode()
    return dg.MetadataValue.md(f"![{name}](data:image/png;base64,{encoded})")


def png_metadata(path: Path) -> dg.MetadataValue:
    """The PNG file at ``path`` inline (png_bytes_metadata), named by its stem."""
    return png_bytes_metadata(path.stem, path.read_bytes())


def table_schema(schema: Mapping[str, pl.DataType], descriptions: Mapping[str, str] | None = None) -> dg.TableSchema:
    """The columns of a frame or parquet file with ``schema`` (a pl.Schema, or a dict of polars
    types) in order, each typed as polars names it (``Datetime(time_unit='us', time_zone='UTC')``)
    and described by ``descriptions`` (the UI's Description column; none for a column it lacks)."""
    descriptions = descriptions or {}
    return dg.TableSchema(
        columns=[dg.TableColumn(name, str(dtype), description=descriptions.get(name)) for name, dtype in schema.items()]
    )


# Dagster's key for a table's columns (https://docs.dagster.io/guides/build/assets/metadata-and-tags/table-metadata).
COLUMN_SCHEMA = "dagster/column_schema"


def column_schema(columns: Columns, written: Mapping[str, pl.DataType] | None = None) -> dict[str, dg.TableSchema]:
    """``dagster/column_schema`` metadata (the UI's Columns tab; what the column-schema-change
    checks compare between materialisations) for a table declared as ``columns``: its schema, or
    at materialisation the ``written`` frame's or file's (so a drift shows), with the declared
    descriptions."""
    return {COLUMN_SCHEMA: table_schema(columns.schema if written is None else written, columns.descriptions)}


# A table's bounds in the metadata (the Dagster event log keeps every byte, and the UI loads it with
# the asset's page): a hostile GDELT file's codes are as long and as many as its lines allow (the
# parser holds no field to a length). The asset's own file keeps them all.
MAX_TABLE_ROWS = 500
MAX_CELL_CHARS = 1000


def _cell(value: object) -> str | int | float | bool | None:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = visible_text(value if isinstance(value, str) else str(value))
    return text if len(text) <= MAX_CELL_CHARS else f"{text[: MAX_CELL_CHARS - 1]}… ({len(text):,} characters)"


def frame_table(frame: pl.DataFrame) -> dg.TableMetadataValue:
    """``frame``'s first MAX_TABLE_ROWS rows as a table the UI shows with its columns and types,
    each text cut to MAX_CELL_CHARS (saying how long it was). The UI renders each cell as
    plain text (React text, not Markdown), so a cell needs no Markdown escaping; text still gets
    its hidden characters shown (pipeline.markdown.visible_text): a bidi control or a zero-width
    space in a GDELT code or a submitter's name would change what the cell displays."""
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord({k: _cell(v) for k, v in row.items()})
            for row in frame.head(MAX_TABLE_ROWS).iter_rows(named=True)
        ],
        schema=table_schema(frame.schema),
    )
