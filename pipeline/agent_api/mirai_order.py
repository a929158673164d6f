"""The order MIRAI's code (``APIs/api_implementation.py`` in github.com/yecchen/MIRAI) gives to what
it leaves to pandas' and numpy's sorts: equal counts in ``value_counts``, same-day rows in
``sort_values(by=date, ascending=False)``, equal BM25 scores in ``np.argsort(scores)[::-1]``. An
Environment of dialect "mirai" orders its answers this way, so that its observations are the text
MIRAI's code prints (docs/mirai.md, "The `mirai` mode").

All three are numpy's default sort ("quicksort", an introsort that is not stable) over MIRAI's
rows in the order its files hold them: ``data_kg.csv`` sorted by date, head, relation and tail,
``data_news.csv`` by Docid, which are the orders ``mirai export`` writes (pipeline/splits/
mirai_export.py) and our environment's news order. numpy's portable introsort is the same in
numpy 1.x and 2.x; only its SIMD sorts for numbers (AVX-512 in numpy 1.26, MIRAI's pin; AVX2 too in
numpy 2) order ties differently, and they differ between machines. Sorting an object array always
takes the portable path, so these functions give the order MIRAI's code gives wherever numpy sorts
without SIMD (a machine without AVX-512 for MIRAI's pinned numpy 1.26), the same on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

# The row order of MIRAI's data_kg.csv as mirai export writes it.
KG_ORDER = ("date", "s", "r", "o")


def _portable_argsort(values: Sequence) -> np.ndarray:
    return np.array(list(values), dtype=object).argsort(kind="quicksort")


def descending(values: Sequence) -> list[int]:
    """Positions of ``values`` in the order pandas' ``sort_values(ascending=False)`` gives them
    (``nargsort`` in pandas/core/sorting.py: reverse, argsort, reverse)."""
    n = len(values)
    if n == 0:
        return []
    order = _portable_argsort(list(values)[::-1])
    return (n - 1 - order)[::-1].tolist()


def value_counts(values: pl.Series) -> list[tuple[str, int]]:
    """(value, count) most frequent first, as ``Series.value_counts()`` gives them: the distinct
    values in order of first appearance, then sorted by count, descending."""
    counts = values.cast(pl.String).to_frame("value").group_by("value", maintain_order=True).len()
    items = list(counts.iter_rows())
    return [items[i] for i in descending(counts.get_column("len").to_list())]


def best_first(scores: Sequence[float], limit: int) -> list[int]:
    """Positions of the ``limit`` best ``scores``, as ``np.argsort(scores)[::-1][:limit]`` gives them."""
    return _portable_argsort([float(s) for s in scores])[::-1][:limit].tolist()


def kg_rows(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` in MIRAI's data_kg.csv order."""
    return events.sort(list(KG_ORDER))


def newest_first(days: pl.Series) -> list[int]:
    """Row positions of ``days`` as MIRAI's ``sort_values(by=..., ascending=False)`` orders them."""
    return descending([d.isoformat() for d in days])
