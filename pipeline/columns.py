"""A table's columns declared once, each with its polars type and what it holds.

The pl.Schema a table is written with is derived from the declaration, so a column cannot be
added without a description; the Dagster UI's Columns tab (assets/metadata.py), the dataset card
and the Croissant metadata of a release read the descriptions from the same place.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl


class Columns:
    """``{name: (dtype, description)}`` in column order: ``schema`` is the pl.Schema to write
    with, ``descriptions`` each column's one-line meaning."""

    def __init__(self, declared: Mapping[str, tuple[pl.DataType | type[pl.DataType], str]]) -> None:
        blank = [name for name, (_, description) in declared.items() if not description.strip()]
        if blank:
            raise ValueError(f"columns without a description: {blank}")
        self.schema = pl.Schema({name: dtype for name, (dtype, _) in declared.items()})
        self.descriptions = {name: description for name, (_, description) in declared.items()}
