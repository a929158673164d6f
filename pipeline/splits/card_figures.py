"""The figures of a split's dataset card and the counts they draw: answer relations by CAMEO
level-1 code and MIRAI quad class, queries by (subject, object) for the busiest countries, the
queries of every split up to the month by quad class and by the subject's region, and the month's
two operator pictures (its GDELT slot ledger and its OBELICS funnel), read from the data directory
and drawn by the functions the Dagster metadata shows them with.

Out of card.py, which writes the card's text; the text also reads these counts (quad classes in
Composition). Bare Agg figures and matplotlib's default style (pipeline/figures.py), so the same
queries give the same PNG bytes on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.articles.day import ARTICLES_SCHEMA
from pipeline.articles.funnel import funnel_frame, funnel_png
from pipeline.config import ArticleSettings
from pipeline.figures import OKABE_ITO, new_figure, rendered_png
from pipeline.gdelt.ledger_figure import month_heatmap_png, month_slot_states, read_month_ledgers
from pipeline.reference.tables import relation_table
from pipeline.release.layout import (  # names a release may hold
    FUNNEL_FIGURE,
    LEDGER_FIGURE,
    MONTHS_FIGURE,
    PAIRS_FIGURE,
    RELATION_FIGURE,
)
from pipeline.splits.database import month_days
from pipeline.storage import DataLayout, atomic_write_bytes, verified

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
# The months figure stacks the subject's region: GeoNames has 7 continents, so the 6 in most
# queries are shown and the rest (Antarctica, a country without a region) is "Other".
TOP_REGIONS = 6
OTHER_REGION = "Other"
# Paul Tol's "muted" qualitative scheme (https://personal.sron.nl/~pault/#sec:qualitative): also
# colour-blind safe, and unlike the quad classes' colours, so a region never reads as a class.
REGION_COLOURS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#DDCC77", "#CC6677")
OTHER_COLOUR = "#DDDDDD"

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


def _quad_classes() -> pl.DataFrame:
    return pl.DataFrame({"mirai_quad_class": list(QUAD_NAMES)}, schema={"mirai_quad_class": pl.Int8})


def _query_quads(queries: pl.LazyFrame, *keep: str) -> pl.LazyFrame:
    """One row per query and quad class its answer includes, with the query's ``keep`` columns."""
    return (
        queries.select(*keep, pl.int_range(pl.len()).alias("row"), pl.col("answer_level1").alias("level1"))
        .explode("level1")
        .join(_level1_table().lazy(), on="level1")
        .select(*keep, "row", "mirai_quad_class")
        .unique()
    )


def quad_counts(queries: pl.DataFrame) -> pl.DataFrame:
    """Queries whose answer includes at least one relation of each quad class (a query with
    relations in two classes counts in both, so the column can sum to more than the queries)."""
    per_query = _query_quads(queries.lazy()).group_by("mirai_quad_class").agg(pl.len().alias("queries")).collect()
    return (
        _quad_classes()
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


@dataclass(frozen=True)
class MonthsComposition:
    """What the months figure draws; each frame has every month with every group, zero when absent."""

    months: list[date]  # the months with a split, oldest first (the split being built last)
    quads: pl.DataFrame  # month, mirai_quad_class, queries: in (month, class) order
    regions: pl.DataFrame  # month, region, queries: in (month, region rank) order


def months_composition(
    queries: pl.DataFrame, month: date, earlier: Mapping[date, Path], top_regions: int = TOP_REGIONS
) -> MonthsComposition:
    """The queries of ``month`` (the frame being split) and of each earlier split (``earlier``:
    month -> its queries.parquet, scanned lazily) per month, by quad class and by the subject's region.

    Per quad class, as in quad_counts: the queries whose answer includes a relation of the class (a
    query counts once in each of its classes). Per region: the ``top_regions`` in most queries over
    all the months (ties by name), then OTHER_REGION for the rest and for a subject without a
    region, so a month's region counts sum to its queries.

    Raises ValueError for a split of ``month`` or later: a split, and the release that carries it,
    must not depend on later data.
    """
    later = sorted(m for m in earlier if m >= month)
    if later:
        raise ValueError(f"the months figure of {month:%Y-%m} was given the split of {later[0]:%Y-%m}, not earlier")
    months = [*sorted(earlier), month]
    columns = ("answer_level1", "s_region")
    scans = [pl.scan_parquet(earlier[m]).select(columns) for m in months[:-1]] + [queries.lazy().select(columns)]
    rows = pl.concat([scan.with_columns(month=pl.lit(m, dtype=pl.Date)) for scan, m in zip(scans, months)])
    per_class = _query_quads(rows, "month").group_by("month", "mirai_quad_class").agg(pl.len().alias("queries"))
    per_region = rows.group_by("month", "s_region").agg(pl.len().alias("queries"))
    per_class, per_region = pl.collect_all([per_class, per_region])

    ranked = (
        per_region.drop_nulls("s_region")
        .group_by("s_region")
        .agg(pl.col("queries").sum())
        .sort(["queries", "s_region"], descending=[True, False])
        .head(top_regions)["s_region"]
        .to_list()
    )
    regions = per_region.group_by(
        "month",
        region=pl.when(pl.col("s_region").is_in(ranked)).then("s_region").otherwise(pl.lit(OTHER_REGION)),
    ).agg(pl.col("queries").sum())
    # OTHER_REGION only when some query falls in it: an empty band would still take a legend entry.
    shown = [*ranked, *([OTHER_REGION] if (regions["region"] == OTHER_REGION).any() else [])]
    every_month = pl.DataFrame({"month": months}, schema={"month": pl.Date})
    return MonthsComposition(
        months=months,
        quads=_every_month(every_month, _quad_classes(), per_class, ["month", "mirai_quad_class"]),
        regions=_every_month(
            every_month, pl.DataFrame({"region": shown}, schema={"region": pl.String}), regions, ["month", "region"]
        ),
    )


def _every_month(months: pl.DataFrame, groups: pl.DataFrame, counts: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """``counts`` on every (month, group), zero when absent, in month then ``groups``' order."""
    return (
        months.join(groups.with_row_index("order"), how="cross")
        .join(counts, on=key, how="left")
        .with_columns(pl.col("queries").fill_null(0).cast(pl.Int64))
        .sort("month", "order")
        .drop("order")
    )


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def render_figures(
    queries: pl.DataFrame, out_dir: Path, month: date, earlier: Mapping[date, Path], data: DataLayout
) -> dict[str, Path]:
    """Write relation_distribution.png, country_pairs.png, queries_by_month.png, slot_ledger.png
    and obelics_funnel.png into out_dir; {file name: path}. ``queries`` is ``month``'s split;
    ``earlier`` maps each earlier month with a split to its queries.parquet
    (DataLayout.split_months), for the months figure; ``data`` is the data directory the month's
    slot ledgers and articles tables are read from.

    The same inputs give byte-identical files, so their sha256 in the manifest is reproducible.
    """
    out_dir = Path(out_dir)
    month = month.replace(day=1)
    composition = months_composition(queries, month, earlier)
    pictures = {
        RELATION_FIGURE: lambda: rendered_png(lambda: _relation_figure(queries)),
        PAIRS_FIGURE: lambda: rendered_png(lambda: _pairs_figure(queries)),
        MONTHS_FIGURE: lambda: rendered_png(lambda: _months_figure(composition)),
        LEDGER_FIGURE: lambda: month_ledger_png(data, month),
        FUNNEL_FIGURE: lambda: month_funnel_png(data, month),
    }
    paths = {}
    for name, png in pictures.items():
        paths[name] = out_dir / name
        atomic_write_bytes(paths[name], png())
    return paths


def month_ledger_png(data: DataLayout, month: date) -> bytes:
    """The slot ledger of the whole of ``month`` (days × 96 slots); a day without a ledger file
    is drawn as "no ledger"."""
    last = month_days(month)[-1]
    return month_heatmap_png(month_slot_states(read_month_ledgers(data, last), last))


def month_articles(data: DataLayout, month: date) -> pl.DataFrame:
    """The month's articles tables (the columns the funnel counts, ``day`` and ``profile``) in
    day order; a day without a table adds no rows. A stored table that changed after it was
    written raises DamagedFile, as for the database built from the same tables."""
    paths = [data.articles_path(d) for d in month_days(month) if data.articles_path(d).is_file()]
    columns = ("day", "extraction_error", "kept", "failing_filter", "profile")
    if not paths:
        return ARTICLES_SCHEMA.to_frame().select(columns)
    return (
        pl.scan_parquet(verified(data, *paths))
        .select(columns)
        .collect()
        .match_to_schema(pl.Schema({c: ARTICLES_SCHEMA[c] for c in columns}))
    )


def month_funnel(articles: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """(funnel_frame, profile) of the month's articles tables summed over its days, for the
    profile of the last day with articles (the default profile when there are none), over the days
    filtered with it: one funnel's stages are one profile's filters.

    The tables hold one row per stored page, not the selected URLs a fetch failed on (those are
    only in the fetch ledger, which keeps no day), so the month's funnel starts at the stored pages:
    it has no "selected" bar, and the card says so."""
    if articles.is_empty():
        profile = ArticleSettings.model_fields["article_profile"].default
    else:
        profile = articles.sort("day")["profile"][-1]
        articles = articles.filter(pl.col("profile") == profile)
    return funnel_frame(articles.height, articles, profile).filter(pl.col("stage") != "selected"), profile


def month_funnel_png(data: DataLayout, month: date) -> bytes:
    funnel, profile = month_funnel(month_articles(data, month))
    return funnel_png(funnel, profile)


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


def _months_figure(composition: MonthsComposition) -> Figure:
    quads, regions = composition.quads, composition.regions
    per_month = dict(regions.group_by("month").agg(pl.col("queries").sum()).iter_rows())
    month = composition.months[-1]
    fig = new_figure(12, 8)
    title = (
        f"Queries per month of every split through {month:%Y-%m} "
        f"({len(composition.months)} split(s), {sum(per_month.values()):,} queries)"
    )
    if not sum(per_month.values()):
        return _no_queries(fig, title)
    # Every month from the first split on: a month without a split keeps its place on the axis.
    axis = pl.date_range(composition.months[0], month, interval="1mo", eager=True).to_list()
    top, bottom = fig.subplots(2, 1, sharex=True)
    quad_bands = [
        (f"{q} {name}", QUAD_COLOURS[q], quads.filter(pl.col("mirai_quad_class") == q))
        for q, name in QUAD_NAMES.items()
    ]
    _stacked_months(top, axis, quad_bands)
    top.set_ylabel("queries with a relation\nin the class")
    top.set_title(
        "By MIRAI quad class of the answer (a query with relations in two classes counts in both)", fontsize=11
    )
    top.legend(title="MIRAI quad class", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9)
    shown = regions["region"].unique(maintain_order=True).to_list()
    region_bands = [
        (name, OTHER_COLOUR if name == OTHER_REGION else REGION_COLOURS[i], regions.filter(pl.col("region") == name))
        for i, name in enumerate(shown)
    ]
    bars = _stacked_months(bottom, axis, region_bands)
    # The region bands sum to the month's queries: that total above each bar.
    bottom.bar_label(bars, labels=[f"{per_month[m]:,}" if m in per_month else "" for m in axis], fontsize=8)
    bottom.set_ylabel("queries")
    bottom.set_title("By the subject's region", fontsize=11)
    bottom.legend(title="subject's region", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9)
    for ax in (top, bottom):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.5
        ax.margins(y=0.1)
        for i, m in enumerate(axis):
            if m not in per_month:
                ax.text(i, 0, "no split", rotation=90, ha="center", va="bottom", fontsize=8, color="0.4")
    bottom.set_xticks(range(len(axis)), [f"{m:%Y-%m}" for m in axis], rotation=90 if len(axis) > 12 else 0)
    fig.suptitle(title, fontsize=13)
    return fig


def _stacked_months(ax, axis: list[date], bands: list[tuple[str, str, pl.DataFrame]]):
    """Bars per month of ``axis`` stacked from (label, colour, month and queries) bands, first at
    the bottom; returns the top band's bars."""
    index = {m: i for i, m in enumerate(axis)}
    base = np.zeros(len(axis), dtype=np.int64)
    for label, colour, band in bands:
        heights = np.zeros(len(axis), dtype=np.int64)
        heights[band["month"].replace_strict(index, return_dtype=pl.Int64).to_numpy()] = band["queries"].to_numpy()
        bars = ax.bar(range(len(axis)), heights, bottom=base, color=colour, label=label, width=0.8)
        base = base + heights
    return bars
