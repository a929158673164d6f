"""The leaderboards' line charts of a score over time with its 95% intervals: each agent's
second-level F1 month over month (pipeline/evaluation/board_files.py) and each live model's
cumulative score round over round (pipeline/live/board.py), drawn by matplotlib as inline SVG.

Names on a chart come from submitters: they are drawn with ``text.parse_math`` off (a "$" in a
name is a dollar sign, never mathtext that could fail the whole page), with hidden characters
shown (pipeline.markdown.visible_text) and cut to NAME_CHARS, and every text is a path in the
SVG, so nothing in a name reaches the page's markup.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from pipeline.markdown import visible_text

# Texts are never mathtext (see the module doc); the same figure gives the same bytes.
SAFE_TEXT = {"text.parse_math": False}
NAME_CHARS = 40
# Line colours, one per series in order (matplotlib's tab10, then tab10 again with other markers).
PALETTE = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive", "cyan"))
MARKERS = ("o", "s", "^", "D", "v")


def shown_name(name: str) -> str:
    """A submitter's name as a chart shows it: hidden characters visible, at most NAME_CHARS."""
    text = visible_text(" ".join(name.split()))
    return text if len(text) <= NAME_CHARS else text[: NAME_CHARS - 1] + "…"


@dataclass(frozen=True)
class Point:
    x: int  # the index of its label on the x axis
    value: float
    low: float | None
    high: float | None
    hollow: bool = False  # drawn unfilled (a contaminated run on the monthly board)


@dataclass(frozen=True)
class Series:
    """One line: a name for the legend and its points, in x order; dashed for a second kind of row
    (submissions, baselines), as the chart's key says."""

    name: str
    points: list[Point] = field(default_factory=list)
    dashed: bool = False


@dataclass(frozen=True)
class Key:
    """What the dashed lines and the hollow markers mean on this chart (None: not used)."""

    solid: str
    dashed: str | None = None
    hollow: str | None = None


def trend_svg(series: list[Series], ticks: list[str], *, ylabel: str, key: Key, salt: str) -> str:
    """An inline <svg> element: each series' values over ``ticks`` with 95% interval error bars
    (a series' points a little apart from the others', so overlapping bars stay readable), a
    legend naming each line and one saying what solid, dashed, hollow and the bars mean. ``salt``
    keeps the element ids of two charts on one page apart; no date is written."""
    # Imported when a chart is drawn: the data classes above are read by every Dagster process
    # (the live board's module), matplotlib is ~0.4 s of a process's start.
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rc = SAFE_TEXT | {"svg.fonttype": "path", "svg.hashsalt": salt}
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        fig = Figure(figsize=(9, 3.6), dpi=100, layout="constrained")
        FigureCanvasSVG(fig)
        ax = fig.add_subplot()
        spread = min(0.3, 0.06 * max(len(series) - 1, 0))
        for i, line in enumerate(series):
            color, marker = PALETTE[i % len(PALETTE)], MARKERS[(i // len(PALETTE)) % len(MARKERS)]
            shift = (i / (len(series) - 1) - 0.5) * spread if len(series) > 1 else 0.0
            xs = [p.x + shift for p in line.points]
            values = [p.value for p in line.points]
            style = "--" if line.dashed else "-"
            ax.plot(xs, values, style, color=color, marker=marker, label=shown_name(line.name), zorder=2)
            for x, p in zip(xs, line.points):
                if p.low is not None:
                    # A percentile interval need not contain the mean; an error bar cannot be negative.
                    spans = [[max(p.value - p.low, 0.0)], [max(p.high - p.value, 0.0)]]
                    ax.errorbar([x], [p.value], yerr=spans, color=color, capsize=3, linewidth=1, zorder=1)
                if p.hollow:
                    ax.plot([x], [p.value], marker=marker, color=color, markerfacecolor="white", zorder=3)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlim(-0.5, len(ticks) - 0.5)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", color="0.9")
        fig.legend(loc="outside right upper", fontsize=8, title="name", title_fontsize=8, handlelength=3.5)
        styles = [Line2D([], [], color="0.3", linestyle="-", marker="o", label=key.solid)]
        if key.dashed:
            styles.append(Line2D([], [], color="0.3", linestyle="--", marker="o", label=key.dashed))
        if key.hollow:
            styles.append(
                Line2D([], [], color="0.3", linestyle="", marker="o", markerfacecolor="white", label=key.hollow)
            )
        styles.append(Line2D([], [], color="0.3", linestyle="", marker="|", markersize=12, label="95% interval"))
        fig.legend(
            handles=styles, loc="outside lower center", ncols=len(styles), fontsize=8, frameon=False, handlelength=3.5
        )
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML prolog and DOCTYPE, which HTML does not take
