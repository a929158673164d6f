"""A day's OBELICS funnel: how many of the selected articles survive each step, from selection
through fetching and extraction and each document-level filter of the profile, in the order the
filters run, to the documents kept; as a frame and as a horizontal-bar picture.

Every document of the day's articles table was stored (fetched HTML) and stops at its first
failure (``failing_filter``: ``extraction:<error>``, a document filter's name or
``domain_dedup``), so each step's count is the previous one less what that step dropped.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from pipeline.articles.obelics import PROFILES
from pipeline.figures import OKABE_ITO, new_figure, rendered_png

DOMAIN_DEDUP = "domain_dedup"  # the failing_filter of a document per-domain dedup emptied (obelics.py)
FIRST_STAGES = ("selected", "stored", "extracted")
KEPT = "kept"


def filter_stages(profile: str) -> list[str]:
    """The profile's document filters in the order they run, then domain_dedup if it allows it."""
    chosen = PROFILES[profile]
    return [rule.name for rule in chosen.document] + ([DOMAIN_DEDUP] if chosen.allows_domain_dedup else [])


def funnel_frame(selected: int, articles: pl.DataFrame, profile: str) -> pl.DataFrame:
    """``stage``, ``documents`` (still in after the stage) and ``dropped`` (by it; null for
    ``selected``): selected, stored, extracted, one row per filter stage, kept.

    ``selected`` is the day's selected URL count (DayArticles.selected); ``articles`` its articles
    table (ARTICLES_SCHEMA), one row per stored page."""
    totals = articles.select(
        pl.lit(selected).alias("selected"),
        pl.len().alias("stored"),
        pl.col("extraction_error").is_null().sum().alias("extracted"),
        pl.col("kept").sum().alias(KEPT),
    ).cast(pl.Int64)
    firsts = totals.unpivot(on=list(FIRST_STAGES), variable_name="stage", value_name="documents")
    dropped = (
        articles.filter(pl.col("extraction_error").is_null() & ~pl.col("kept"))
        .group_by(pl.col("failing_filter").alias("stage"))
        .agg(pl.len().alias("dropped"))
    )
    filters = (
        pl.DataFrame({"stage": filter_stages(profile)})
        .join(dropped, on="stage", how="left", maintain_order="left")
        .select(
            "stage",
            (totals["extracted"].item() - pl.col("dropped").fill_null(0).cast(pl.Int64).cum_sum()).alias("documents"),
        )
    )
    kept = totals.select(pl.lit(KEPT).alias("stage"), pl.col(KEPT).alias("documents"))
    return pl.concat([firsts, filters, kept]).with_columns(
        (pl.col("documents").shift(1) - pl.col("documents")).alias("dropped")
    )


def funnel_png(funnel: pl.DataFrame, profile: str) -> bytes:
    """The PNG (1000 pixels wide, 0.4 inch per stage tall) of a funnel_frame."""
    return rendered_png(lambda: _funnel_figure(funnel, profile))


# What the funnel's first bar counts: a day's funnel starts at selection; a month's, drawn from the
# stored tables alone, at the stored pages (pipeline/splits/card_figures.py month_funnel).
_START_NOUN = {"selected": "selected articles", "stored": "stored pages"}


def _label(stage: str) -> str:
    if stage == "stored":
        return "stored (fetched HTML)"
    if stage in (*FIRST_STAGES, KEPT):
        return stage
    return f"after {stage}"


def _funnel_figure(funnel: pl.DataFrame, profile: str) -> Figure:
    fig = new_figure(10, 1.4 + 0.4 * funnel.height)
    ax = fig.subplots()
    stages = funnel["stage"].to_list()
    documents = funnel["documents"].to_list()
    colours = [
        OKABE_ITO["blue"] if s in FIRST_STAGES else OKABE_ITO["bluish_green"] if s == KEPT else OKABE_ITO["sky_blue"]
        for s in stages
    ]
    y = np.arange(funnel.height)
    bars = ax.barh(y, documents, color=colours)
    # Each bar's count, with what its step dropped when it dropped anything.
    labels = [
        f"{n:,}" if not lost else f"{n:,}  (−{lost:,})" for n, lost in zip(documents, funnel["dropped"].to_list())
    ]
    ax.bar_label(bars, labels, padding=3, fontsize=9)
    ax.set_yticks(y, [_label(s) for s in stages], fontsize=9)
    ax.invert_yaxis()  # the funnel's top is selection
    ax.set_xlabel("documents")
    ax.set_xlim(0, max(max(documents, default=0), 1) * 1.18)  # room for the labels; an empty day still draws
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(
        f"OBELICS funnel, profile {profile}: {documents[-1]:,} of {documents[0]:,} {_START_NOUN[stages[0]]} kept",
        fontsize=12,
    )
    return fig
