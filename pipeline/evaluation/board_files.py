"""The leaderboard's three files, from the ranked table pipeline/evaluation/board.py builds:
leaderboard.parquet (the table), leaderboard.png (the newest month's chart) and leaderboard.html
(every month, each section a plot and a table, self-contained), written by ``write_leaderboard``
under evaluations/. Matplotlib draws both plots; the same board gives the same bytes in all three
(docs/evaluation.md, "The leaderboard")."""

from __future__ import annotations

import html
import io
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.style
import polars as pl
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
from pipeline.evaluation.run import AGGREGATION_RULE, RANK_METRIC, RANK_RULE
from pipeline.evaluation.scoring import HIT_K
from pipeline.markdown import html_text
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


def _with_interval(row: Mapping, metric: str) -> str:
    low, high = row[f"{metric}_ci95_low"], row[f"{metric}_ci95_high"]
    if row[metric] is None:
        return ""
    interval = "" if low is None else f' <span class="ci">[{low:.2f}, {high:.2f}]</span>'
    return f"{row[metric]:.2f}{interval}"


# (header, cell) of each column of the page's tables; a cell's text is escaped, its hidden characters
# shown (pipeline.markdown.html_text), unless it is markup made here from numbers.
_PAGE_COLUMNS = (
    ("rank", lambda r: str(r["rank"]) if r["rank"] is not None else ("contaminated" if r["contaminated"] else "–")),
    (
        "≈ leader",
        lambda r: "leader" if r["rank"] == 1 and r["overlaps_leader"] else "≈" if r["overlaps_leader"] else "",
    ),
    ("name", lambda r: html_text(r["agent"])),
    ("source", lambda r: html_text(r["source"])),
    ("model", lambda r: html_text(r["model"] or "")),
    ("knowledge cutoff", lambda r: html_text(r["knowledge_cutoff"] or "")),
    ("L2 F1 [95% CI]", lambda r: _with_interval(r, "level2_f1")),
    ("L1 F1 [95% CI]", lambda r: _with_interval(r, "level1_f1")),
    ("L2 precision", lambda r: _number(r["level2_precision"])),
    ("L2 recall", lambda r: _number(r["level2_recall"])),
    ("quad KL [95% CI]", lambda r: _with_interval(r, "quad_kl")),
    ("MRR [95% CI]", lambda r: _with_interval(r, "mrr")),
    (f"Hit@{HIT_K}", lambda r: _number(r[f"hit_at_{HIT_K}"])),
    ("n", lambda r: str(r["n"])),
    ("rounds", lambda r: str(r["rounds"])),
    ("aggregation", lambda r: html_text(r["aggregation"] or "")),
    ("tokens in / out", lambda r: "" if r["tokens_in"] is None else f"{r['tokens_in']:,} / {r['tokens_out'] or 0:,}"),
    ("cost (USD)", lambda r: _number(r["cost_usd"])),
    ("API mode", lambda r: html_text(r["mode"] or "")),
    ("tools", lambda r: html_text(r["tools"] or "")),
    ("action type", lambda r: html_text(r["action_type"] or "")),
)
# No request leaves the page: nothing but inline styles may load, not even an image.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
tr.contaminated td { color: #888; }
tr.submission td:nth-child(3) { font-style: italic; }
.ci { color: #666; font-size: 0.9em; }
.rule { max-width: 60em; color: #444; }
figure { margin: 0 0 1em 0; }
figure svg { max-width: 100%; height: auto; }
section.distance { border-top: 3px solid #888; margin-top: 2em; }
.legend { max-width: 60em; color: #444; padding-left: 1.2em; }
.swatch { display: inline-block; width: 1.6em; height: 0.9em; vertical-align: middle; margin-right: 0.3em; }
.swatch.registered { background: #1f77b4; }
.swatch.submission { background: #2ca02c; }
.swatch.contaminated { background: #b3b3b3; }
.swatch.leader { background: rgba(255, 215, 0, 0.35); }
.sample-italic { font-style: italic; }
.sample-grey { color: #888; }
"""
# The page's key: every colour and style of its plots and tables, in the order a reader meets them.
_LEGEND = (
    '<span class="swatch registered"></span>blue bar: a registered run (evaluated by the pipeline); '
    '<span class="swatch submission"></span>green bar: a submission (scored from its submitter\'s predictions); '
    '<span class="swatch contaminated"></span>grey bar: contaminated, shown but not ranked',
    "error bar: the row's 95% bootstrap interval over queries; "
    '<span class="swatch leader"></span>yellow band: the leader\'s interval; ▲ Max@K and ◆ repeated '
    'second-level F1 (runs of K rounds, "Aggregation" in docs/evaluation.md)',
    "bar labels and the \u201c≈ leader\u201d column: <b>leader</b> marks the rank-1 rows; <b>≈</b> a ranked "
    "row whose interval overlaps the leader's (not separable from it at this number of queries); "
    "blank: its interval lies below the leader's",
    'table: a name in <span class="sample-italic">italics</span> is a submission; a '
    '<span class="sample-grey">grey row</span> is contaminated; rank \u201c–\u201d: scored 0 on all three '
    "ranking metrics, not ranked",
    "across months: one line per name (its colour in the chart's legend), a solid line a registered "
    "run, a dashed one a submission, a hollow marker a contaminated month; error bars are 95% intervals",
)


def _section_id(*parts: object) -> str:
    return html.escape("-".join(str(p) for p in parts))


def _table(rows: list[dict]) -> list[str]:
    out = [
        "<table>",
        "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h, _ in _PAGE_COLUMNS) + "</tr></thead>",
        "<tbody>",
    ]
    for row in rows:
        classes = " ".join(c for c in (row["source"], "contaminated" if row["contaminated"] else "") if c)
        cells = "".join(f"<td>{cell(row)}</td>" for _, cell in _PAGE_COLUMNS)
        out.append(f'<tr class="{classes}">{cells}</tr>')
    return [*out, "</tbody>", "</table>"]


def page(board: pl.DataFrame) -> bytes:
    """leaderboard.html: one section per query set × distance, each a chart of every name's
    second-level F1 across months and, per month (newest first), a plot and a table; the ranking,
    interval and aggregation rules and a key to every colour and style at the top. Self-contained
    (inline style, inline SVG; the CSP forbids any request) and free of the time it was made, so
    the same board gives the same bytes. Every text from a record is escaped: names and models
    come from submitters."""
    groups = sorted({(q, d) for q, d in board.select("query_set", "distance").iter_rows()})
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>MIRAI leaderboard</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<h1>MIRAI leaderboard</h1>",
        '<p class="rule">Registered agents, evaluated by the pipeline, and submissions, scored from '
        "the predictions their submitters sent (docs/evaluate-your-agent.md). Metrics are percentages "
        "(KL: lower is better). Each distance is its own board: rows of different distances are never "
        "compared.</p>",
        f'<p class="rule" id="rank-rule">{html.escape(RANK_RULE)}.</p>',
        f'<p class="rule">{html.escape(INTERVAL_RULE)}; {html.escape(AGGREGATION_RULE)}.</p>',
        '<p class="rule">Contaminated: the knowledge cutoff is not before the month, so the model may '
        "have seen its events; shown, never ranked.</p>",
        '<h2 id="key">Key</h2>',
        '<ul class="legend">',
        *(f"<li>{item}</li>" for item in _LEGEND),
        "</ul>",
    ]
    if board.is_empty():
        parts.append("<p>No evaluation runs or submissions yet.</p>")
    else:
        parts.append('<nav><ul class="legend">')
        parts += [
            f'<li><a href="#{_section_id(q, "d", d)}">{html.escape(distance_title(q, d))}</a></li>' for q, d in groups
        ]
        parts.append("</ul></nav>")
    for query_set, distance in groups:
        rows = board.filter((pl.col("query_set") == query_set) & (pl.col("distance") == distance))
        key = _section_id(query_set, "d", distance)
        note = DISTANCE_NOTE.format(distance=distance, s="s" if distance != 1 else "")
        parts += [
            f'<section id="{key}" class="distance">',
            f"<h2>{html.escape(distance_title(query_set, distance))}</h2>",
            f'<p class="rule">Distance {distance}: {html.escape(note)}.</p>',
            "<h3>Across months</h3>",
            f'<figure class="months">{months_svg(rows, f"{key}-months")}</figure>',
        ]
        for (month,), month_rows in rows.group_by("month", maintain_order=True):
            month_key = _section_id(query_set, "d", distance, month)
            month_rows = month_rows.to_dicts()
            parts += [
                f'<section id="{month_key}" class="board">',
                f"<h3>{html.escape(month)} · {html.escape(distance_title(query_set, distance))}</h3>",
                f"<figure>{section_svg(month_rows, month_key)}</figure>",
                *_table(month_rows),
                "</section>",
            ]
        parts.append("</section>")
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts).encode()


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
