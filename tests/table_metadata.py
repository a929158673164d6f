"""Reading the table metadata (dg.MetadataValue.table) assets and checks record, in tests."""

from __future__ import annotations

import dagster as dg


def table_rows(value: dg.TableMetadataValue) -> list[dict]:
    """The table's records as dicts, column → the cell as the UI shows it."""
    return [dict(record.data) for record in value.records]


def has_row(value: dg.TableMetadataValue, **cells: object) -> bool:
    """Some record holds every one of ``cells``."""
    return any(cells.items() <= row.items() for row in table_rows(value))


def table_text(value: dg.TableMetadataValue) -> str:
    """Every cell, one after the other: for a phrase anywhere in the table."""
    return " | ".join(str(cell) for row in table_rows(value) for cell in row.values())
