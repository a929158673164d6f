"""The leaderboard's three files, from the ranked table pipeline/evaluation/board.py builds:
leaderboard.parquet (the table), leaderboard.png (the newest month's chart) and leaderboard.html
(every month, each section a plot and a table, self-contained), written by ``write_leaderboard``
under evaluations/. Matplotlib draws both plots; the same board gives the same bytes in all three
(docs/evaluation.md, "The leaderboard")."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.style
import polars as pl
from markupsafe import Markup
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from pipeline.evaluation.board import (
    GROUP,
    INTERVAL_RULE,
    board_frame,
    distance_title,
    rank_interval,
    registered_rows,
    submission_rows,
)
from pipeline.evaluation.board_charts import SAFE_TEXT, Key, Point, Series, shown_name, trend_svg
from pipeline.evaluation.board_html import render
from pipeline.evaluation.run import AGGREGATION_RULE, RANK_METRIC, RANK_RULE
from pipeline.evaluation.scoring import HIT_K
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet

BOARD_FILE = "leaderboard.parquet"
CHART_FILE = "leaderboard.png"
PAGE_FILE = "leaderboard.html"

_COLORS = {"registered": "tab:blue", "submission": "tab:green"}
CONTAMINATED_COLOR = "0.7"
LEADER_BAND = "gold"
# What each colour and mark of the bar charts means, drawn as their legend (and said on the page).
BAR_KEY = (
    ("registered", "registered run"),
    ("submission", "submission"),
    ("contaminated", "contaminated (not ranked)"),
)
DISTANCE_NOTE = "the agent sees events up to {distance} day{s} before each query's date"


def _name(row: Mapping) -> str:
    """A row's label on a bar chart: rank, name, and ≈ when it is not separable from the leader."""
    name = shown_name(row["agent"])
    if row["rank"] is None:
        return f"{name} (not ranked)"
    near = " ≈" if row["overlaps_leader"] and row["rank"] > 1 else ""
    return f"{row['rank']}. {name}{near}"


def _draw(ax, rows: list[dict]) -> None:
    """Horizontal bars of RANK_METRIC with 95% interval error bars, in board order: registered runs
    blue, submissions green, contaminated rows grey; the leader's interval as a band (a row whose
    bar reaches it is ≈ leader); a run's Max@K and repeated second-level F1 as markers where it
    stored them; a legend for each."""
    y = list(range(len(rows)))[::-1]
    values = [r[RANK_METRIC] for r in rows]
    lows = [rank_interval(r)[0] for r in rows]
    highs = [rank_interval(r)[1] for r in rows]
    leader = next((r for r in rows if r["rank"] is not None), None)
    if leader is not None:
        ax.axvspan(*rank_interval(leader), color=LEADER_BAND, alpha=0.25, zorder=0)
    colors = [CONTAMINATED_COLOR if r["contaminated"] else _COLORS[r["source"]] for r in rows]
    ax.barh(
        y,
        values,
        # A percentile interval need not contain the mean; an error bar cannot be negative.
        xerr=[[max(v - lo, 0.0) for v, lo in zip(values, lows)], [max(hi - v, 0.0) for v, hi in zip(values, highs)]],
        color=colors,
        capsize=3,
    )
    used = {"contaminated" if r["contaminated"] else r["source"] for r in rows}
    handles = [
        Patch(color=CONTAMINATED_COLOR if kind == "contaminated" else _COLORS[kind], label=label)
        for kind, label in BAR_KEY
        if kind in used
    ]
    handles.append(Line2D([], [], color="black", marker="|", linestyle="", markersize=10, label="95% interval"))
    if leader is not None:
        handles.append(Patch(color=LEADER_BAND, alpha=0.25, label="leader's 95% interval (≈: overlaps it)"))
    for column, marker, color, name in (
        (f"max_at_k_{RANK_METRIC}", "^", "black", "Max@K"),
        (f"repeated_{RANK_METRIC}", "D", "tab:orange", "repeated (≥ 2 of K)"),
    ):
        points = [(r[column], i) for i, r in zip(y, rows) if r.get(column) is not None]
        if points:
            handles.append(ax.scatter(*zip(*points), marker=marker, color=color, s=24, zorder=3, label=name))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_yticks(y, [_name(r) for r in rows], fontsize=9)
    ax.set_xlabel("second-level F1 (%), mean with 95% bootstrap interval over queries")
    ax.set_xlim(0, 100)


def _figure(height_rows: int) -> Figure:
    return Figure(figsize=(10, 1.4 + 0.35 * max(height_rows, 1)), dpi=100, layout="constrained")


def chart(board: pl.DataFrame) -> bytes:
    """PNG: second-level F1 with its 95% interval of every row of the newest month, in board order,
    one panel per query set and distance (RANK_RULE printed under them); submissions green,
    contaminated rows grey, a legend for each colour and mark."""
    with matplotlib.style.context("default"), matplotlib.rc_context(SAFE_TEXT):
        if board.is_empty():
            fig = _figure(1)
            FigureCanvasAgg(fig)  # a bare Figure on an Agg canvas: no pyplot state, no window
            fig.text(0.5, 0.5, "no evaluation runs yet", ha="center", va="center", fontsize=16, color="0.4")
        else:
            month = board.get_column("month").max()
            newest = board.filter(pl.col("month") == month)  # already in rank order
            groups = [(key, rows.to_dicts()) for key, rows in newest.group_by(*GROUP[1:], maintain_order=True)]
            fig = _figure(sum(len(rows) + 2 for _, rows in groups))
            FigureCanvasAgg(fig)
            axes = fig.subplots(len(groups), 1, squeeze=False, height_ratios=[len(rows) + 1 for _, rows in groups])
            for ax, ((query_set, distance), rows) in zip(axes[:, 0], groups):
                _draw(ax, rows)
                ax.set_title(distance_title(query_set, distance), fontsize=10, loc="left")
            fig.suptitle(f"Leaderboard {month}", fontsize=12)
            # A figure-level label, so the constrained layout leaves room for all its lines.
            fig.supxlabel(textwrap.fill(RANK_RULE, 170), x=0.01, ha="left", fontsize=7, color="0.35")
        buf = io.BytesIO()
        # No "Software" entry: a matplotlib upgrade alone must not change the bytes.
        fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def section_svg(rows: list[dict], salt: str) -> str:
    """An inline <svg> element: one section's rows as in ``chart``. Text is drawn as paths (no
    font is fetched), and with no date and a fixed hash salt the same rows give the same bytes;
    ``salt`` keeps each section's element ids apart within the page."""
    rc = SAFE_TEXT | {"svg.fonttype": "path", "svg.hashsalt": salt}
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        fig = _figure(len(rows))
        FigureCanvasSVG(fig)
        _draw(fig.add_subplot(), rows)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML prolog and DOCTYPE, which HTML does not take


def month_series(rows: pl.DataFrame) -> list[Series]:
    """One query set and distance's rows as lines across months: each name's second-level F1 per
    month with its 95% interval (x: the month's index, oldest first); submissions dashed,
    contaminated months hollow. Listed as the newest month ranks them, then the names no longer
    there (a submission is one month's: its name is new each time)."""
    months = sorted(rows.get_column("month").unique().to_list())
    order = rows.sort("month", descending=True, maintain_order=True).unique(["agent", "source"], maintain_order=True)
    series = []
    for agent, source in order.select("agent", "source").iter_rows():
        own = rows.filter((pl.col("agent") == agent) & (pl.col("source") == source)).sort("month").to_dicts()
        points = [
            Point(months.index(r["month"]), r[RANK_METRIC], *rank_interval(r), hollow=r["contaminated"]) for r in own
        ]
        series.append(Series(agent, points, dashed=source == "submission"))
    return series


def months_svg(rows: pl.DataFrame, salt: str) -> str:
    """An inline <svg> element: ``month_series`` drawn with its legends (board_charts.trend_svg)."""
    months = sorted(rows.get_column("month").unique().to_list())
    key = Key(solid="registered run", dashed="submission", hollow="contaminated (not ranked)")
    return trend_svg(month_series(rows), months, ylabel="second-level F1 (%)", key=key, salt=salt)


def _number(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _with_interval(row: Mapping, metric: str) -> Markup | str:
    low, high = row[f"{metric}_ci95_low"], row[f"{metric}_ci95_high"]
    if row[metric] is None:
        return ""
    if low is None:
        return f"{row[metric]:.2f}"
    # Markup.format escapes what it fills in: here numbers only.
    return Markup('{:.2f} <span class="ci">[{:.2f}, {:.2f}]</span>').format(row[metric], low, high)


# (header, cell) of each column of the page's tables; a cell is text (the template escapes it and
# shows its hidden characters) unless it is Markup made here from numbers.
_PAGE_COLUMNS = (
    ("rank", lambda r: str(r["rank"]) if r["rank"] is not None else ("contaminated" if r["contaminated"] else "–")),
    (
        "≈ leader",
        lambda r: "leader" if r["rank"] == 1 and r["overlaps_leader"] else "≈" if r["overlaps_leader"] else "",
    ),
    ("name", lambda r: r["agent"]),
    ("source", lambda r: r["source"]),
    ("model", lambda r: r["model"] or ""),
    ("knowledge cutoff", lambda r: r["knowledge_cutoff"] or ""),
    ("L2 F1 [95% CI]", lambda r: _with_interval(r, "level2_f1")),
    ("L1 F1 [95% CI]", lambda r: _with_interval(r, "level1_f1")),
    ("L2 precision", lambda r: _number(r["level2_precision"])),
    ("L2 recall", lambda r: _number(r["level2_recall"])),
    ("quad KL [95% CI]", lambda r: _with_interval(r, "quad_kl")),
    ("MRR [95% CI]", lambda r: _with_interval(r, "mrr")),
    (f"Hit@{HIT_K}", lambda r: _number(r[f"hit_at_{HIT_K}"])),
    ("n", lambda r: str(r["n"])),
    ("rounds", lambda r: str(r["rounds"])),
    ("aggregation", lambda r: r["aggregation"] or ""),
    ("tokens in / out", lambda r: "" if r["tokens_in"] is None else f"{r['tokens_in']:,} / {r['tokens_out'] or 0:,}"),
    ("cost (USD)", lambda r: _number(r["cost_usd"])),
    ("API mode", lambda r: r["mode"] or ""),
    ("tools", lambda r: r["tools"] or ""),
    ("action type", lambda r: r["action_type"] or ""),
)


def _table_rows(rows: list[dict]) -> list[dict]:
    """A month's rows as the template's table shows them: the row's classes, then its cells."""
    return [
        {
            "classes": " ".join(c for c in (row["source"], "contaminated" if row["contaminated"] else "") if c),
            "cells": [cell(row) for _, cell in _PAGE_COLUMNS],
        }
        for row in rows
    ]


def page(board: pl.DataFrame) -> bytes:
    """leaderboard.html (templates/leaderboard.html): one section per query set × distance, each a
    chart of every name's second-level F1 across months and, per month (newest first), a plot and a
    table; the ranking, interval and aggregation rules and a key to every colour and style at the
    top. Self-contained (inline style, inline SVG; the CSP forbids any request) and free of the time
    it was made, so the same board gives the same bytes. Every text from a record is escaped: names
    and models come from submitters."""
    sections = []
    for query_set, distance in sorted({(q, d) for q, d in board.select("query_set", "distance").iter_rows()}):
        rows = board.filter((pl.col("query_set") == query_set) & (pl.col("distance") == distance))
        key = f"{query_set}-d-{distance}"
        boards = [
            {
                "id": f"{key}-{month}",
                "month": month,
                # matplotlib's SVG writer escapes what it writes, and every text in it is a path
                # (section_svg, board_charts' module doc): no record's text reaches the markup.
                "svg": Markup(section_svg(month_rows.to_dicts(), f"{key}-{month}")),
                "rows": _table_rows(month_rows.to_dicts()),
            }
            for (month,), month_rows in rows.group_by("month", maintain_order=True)
        ]
        sections.append(
            {
                "id": key,
                "title": distance_title(query_set, distance),
                "distance": distance,
                "note": DISTANCE_NOTE.format(distance=distance, s="s" if distance != 1 else ""),
                "months_svg": Markup(months_svg(rows, f"{key}-months")),  # as "svg" above (trend_svg)
                "boards": boards,
            }
        )
    return render(
        "leaderboard.html",
        rank_rule=RANK_RULE,
        interval_rule=INTERVAL_RULE,
        aggregation_rule=AGGREGATION_RULE,
        columns=[header for header, _ in _PAGE_COLUMNS],
        sections=sections,
    )


@dataclass(frozen=True)
class Written:
    """What write_leaderboard wrote: the board, its three files, and the submission records it
    could not show (one line each)."""

    board: pl.DataFrame
    table: Path
    chart: Path
    page: Path
    skipped: list[str]


def write_leaderboard(data_dir: Path | str) -> Written:
    """Rebuild leaderboard.parquet, leaderboard.png and leaderboard.html under evaluations/ from
    every stored run and submission record."""
    directory = DataLayout(data_dir).root / "evaluations"
    submitted, skipped = submission_rows(data_dir)
    board = board_frame(registered_rows(data_dir) + submitted)
    atomic_write_parquet(board, directory / BOARD_FILE)
    atomic_write_bytes(directory / CHART_FILE, chart(board))
    atomic_write_bytes(directory / PAGE_FILE, page(board))
    return Written(board, directory / BOARD_FILE, directory / CHART_FILE, directory / PAGE_FILE, skipped)
