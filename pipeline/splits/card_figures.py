"""The two figures of a split's dataset card and the counts they draw: answer relations by CAMEO
level-1 code and MIRAI quad class, and queries by (subject, object) for the busiest countries.

Out of card.py, which writes the card's text; the text also reads these counts (quad classes in
Composition). Bare Agg figures and matplotlib's default style (pipeline/figures.py), so the same
queries give the same PNG bytes on any machine.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.figures import OKABE_ITO, new_figure, rendered_png
from pipeline.reference.tables import relation_table
from pipeline.release.layout import PAIRS_FIGURE, RELATION_FIGURE  # names a release may hold
from pipeline.storage import atomic_write_bytes

TOP_COUNTRIES = 20
# MIRAI's grouping of the 20 root codes (mirai_quad_class), not GDELT's QuadClass: the two differ
# on 05, 09, 15 and 16, and MIRAI's quad-level metrics use this one.
QUAD_NAMES = {1: "Verbal cooperation", 2: "Material cooperation", 3: "Verbal conflict", 4: "Material conflict"}
QUAD_COLOURS = {
    1: OKABE_ITO["sky_blue"],
    2: OKABE_ITO["blue"],
    3: OKABE_ITO["orange"],
    4: OKABE_ITO["vermillion"],
}

# ---------------------------------------------------------------------------------------------
# Counting (shared by the figures and the card)
# ---------------------------------------------------------------------------------------------


def _level1_table() -> pl.DataFrame:
    """The 20 root codes with their name and MIRAI quad class, in code order."""
    return relation_table().select("level1", "level1_name", "mirai_quad_class").unique().sort("level1")


def level1_counts(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries whose answer includes each level-1 code; all 20 codes, zero when absent."""
    counts = (
        queries.select(pl.col("answer_level1").explode().alias("level1"))
        .drop_nulls()
        .group_by("level1")
        .agg(pl.len().alias("queries"))
    )
    return (
        _level1_table()
        .join(counts, on="level1", how="left")
        .with_columns(pl.col("queries").fill_null(0).cast(pl.Int64))
    )


def quad_counts(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries whose answer includes at least one relation of each quad class (a query with
    relations in two classes counts in both, so the column can sum to more than the queries)."""
    per_query = (
        queries.select(pl.int_range(pl.len()).alias("row"), pl.col("answer_level1").alias("level1"))
        .explode("level1")
        .join(_level1_table(), on="level1")
        .select("row", "mirai_quad_class")
        .unique()
        .group_by("mirai_quad_class")
        .agg(pl.len().alias("queries"))
    )
    return (
        pl.DataFrame({"mirai_quad_class": list(QUAD_NAMES)}, schema={"mirai_quad_class": pl.Int8})
        .join(per_query, on="mirai_quad_class", how="left")
        .with_columns(pl.col("queries").fill_null(0).cast(pl.Int64))
    )


def country_involvement(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries per country as s or o, most involved first (ties by code, for a stable order)."""
    return (
        pl.concat([queries.select(country="s"), queries.select(country="o")])
        .group_by("country")
        .agg(pl.len().alias("queries"))
        .sort(["queries", "country"], descending=[True, False])
    )


def pair_matrix(queries: pl.DataFrame, countries: list[str]) -> np.ndarray:
    """Query counts by (s, o) over the given countries: rows are s, columns o."""
    index = {code: i for i, code in enumerate(countries)}
    pairs = (
        queries.filter(pl.col("s").is_in(countries) & pl.col("o").is_in(countries))
        .group_by("s", "o")
        .agg(pl.len().alias("n"))
        .with_columns(
            pl.col("s").replace_strict(index, return_dtype=pl.Int64).alias("i"),
            pl.col("o").replace_strict(index, return_dtype=pl.Int64).alias("j"),
        )
    )
    matrix = np.zeros((len(countries), len(countries)), dtype=np.int64)
    matrix[pairs["i"].to_numpy(), pairs["j"].to_numpy()] = pairs["n"].to_numpy()
    return matrix


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def render_figures(queries: pl.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Write relation_distribution.png and country_pairs.png into out_dir; {file name: path}.

    The same frame gives byte-identical files, so their sha256 in the manifest is reproducible.
    """
    out_dir = Path(out_dir)
    paths = {}
    for name, draw in ((RELATION_FIGURE, _relation_figure), (PAIRS_FIGURE, _pairs_figure)):
        paths[name] = out_dir / name
        atomic_write_bytes(paths[name], rendered_png(lambda draw=draw: draw(queries)))
    return paths


def _no_queries(fig: Figure, title: str) -> Figure:
    fig.suptitle(title, fontsize=13)
    fig.text(0.5, 0.5, "no queries", ha="center", va="center", fontsize=18, color="0.4")
    return fig


def _relation_figure(queries: pl.DataFrame) -> Figure:
    fig = new_figure(12, 7)
    title = f"Answer relations by CAMEO level-1 code ({queries.height:,} queries)"
    if queries.is_empty():
        return _no_queries(fig, title)
    left, right = fig.subplots(1, 2, width_ratios=[3, 1])
    _level1_panel(left, level1_counts(queries))
    _quad_panel(right, quad_counts(queries))
    fig.suptitle(title, fontsize=13)
    # Below both panels, where no bar can run into it.
    handles = [Patch(color=QUAD_COLOURS[q], label=f"{q} {name}") for q, name in QUAD_NAMES.items()]
    fig.legend(handles=handles, title="MIRAI quad class", loc="outside lower center", ncols=4, fontsize=9)
    return fig


def _level1_panel(ax, counts: pl.DataFrame) -> None:
    labels = [f"{code}  {name}" for code, name in counts.select("level1", "level1_name").iter_rows()]
    values = counts["queries"].to_list()
    colours = [QUAD_COLOURS[q] for q in counts["mirai_quad_class"].to_list()]
    y = np.arange(len(labels))
    bars = ax.barh(y, values, color=colours)
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.invert_yaxis()  # 01 at the top, as CAMEO lists them
    ax.set_xlabel("queries whose answer includes the code")
    ax.margins(x=0.1)


def _quad_panel(ax, counts: pl.DataFrame) -> None:
    classes = counts["mirai_quad_class"].to_list()
    y = np.arange(len(classes))
    bars = ax.barh(y, counts["queries"].to_list(), color=[QUAD_COLOURS[q] for q in classes])
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_yticks(y, [QUAD_NAMES[q].replace(" ", "\n") for q in classes], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("queries with a relation\nin the class")
    ax.set_title("By quad class", fontsize=11)
    ax.margins(x=0.15)


def _pairs_figure(queries: pl.DataFrame) -> Figure:
    fig = new_figure(10, 9)
    if queries.is_empty():
        return _no_queries(fig, "Queries by (subject, object) country")
    countries = country_involvement(queries).head(TOP_COUNTRIES)["country"].to_list()
    matrix = pair_matrix(queries, countries)
    ax = fig.subplots()
    # The diagonal (s == o) cannot hold queries (domestic events are dropped): grey, not "zero".
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="0.8")
    image = ax.imshow(np.ma.masked_where(np.eye(len(countries), dtype=bool), matrix), cmap=cmap, vmin=0)
    ax.set_xticks(range(len(countries)), countries, rotation=90, fontsize=9)
    ax.set_yticks(range(len(countries)), countries, fontsize=9)
    ax.set_xlabel("object o")
    ax.set_ylabel("subject s")
    _annotate_cells(ax, matrix)
    fig.colorbar(image, ax=ax, shrink=0.8, label="queries", ticks=MaxNLocator(integer=True))  # counts: no 0.2
    ax.set_title(
        f"Queries by (s, o) for the {len(countries)} countries in most queries\n"
        f"(these cells hold {int(matrix.sum()):,} of {queries.height:,} queries)",
        fontsize=12,
    )
    return fig


def _annotate_cells(ax, matrix: np.ndarray) -> None:
    # Counts in the non-empty cells; white on the dark half of the colour scale to stay legible.
    dark = matrix.max() / 2
    for i, j in zip(*np.nonzero(matrix)):
        ax.text(
            j,
            i,
            str(matrix[i, j]),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if matrix[i, j] > dark else "black",
        )
