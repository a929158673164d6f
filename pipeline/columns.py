"""A table's columns declared once, each with its polars type and what it holds.

The pl.Schema a table is written with is derived from the declaration, so a column cannot be
added without a description; the Dagster UI's Columns tab (assets/metadata.py) and the dataset
card read the descriptions from the same place. (Croissant's fields do not carry them yet: adding
them would change croissant.json of every month already published.)
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
        self._declared = dict(declared)
        self.schema = pl.Schema({name: dtype for name, (dtype, _) in declared.items()})
        self.descriptions = {name: description for name, (_, description) in declared.items()}

    def declared(self, *names: str) -> dict[str, tuple[pl.DataType | type[pl.DataType], str]]:
        """The declarations of ``names``, in that order: for a table that shares columns with this one."""
        return {name: self._declared[name] for name in names}
