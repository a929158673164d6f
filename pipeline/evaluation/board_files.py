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

from pipeline.evaluation.board import INTERVAL_RULE, board_frame, rank_interval, registered_rows, submission_rows
from pipeline.evaluation.run import AGGREGATION_RULE, RANK_METRIC, RANK_RULE
from pipeline.evaluation.scoring import HIT_K
from pipeline.markdown import html_text, visible_text
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet

BOARD_FILE = "leaderboard.parquet"
CHART_FILE = "leaderboard.png"
PAGE_FILE = "leaderboard.html"

_COLORS = {"registered": "tab:blue", "submission": "tab:green"}


def _label(row: Mapping) -> str:
    head = f"{row['rank']}. " if row["rank"] else ""
    tail = " (contaminated)" if row["contaminated"] else ""
    source = " [submission]" if row["source"] == "submission" else ""
    return f"{head}{visible_text(row['agent'])}{source} · d={row['distance']} · {row['query_set']}{tail}"


def _draw(ax, rows: list[dict], labels: list[str]) -> None:
    """Horizontal bars of RANK_METRIC with 95% interval error bars, in board order; contaminated
    rows grey; a run's Max@K and repeated second-level F1 as markers where it stored them."""
    y = list(range(len(rows)))[::-1]
    values = [r[RANK_METRIC] for r in rows]
    lows = [rank_interval(r)[0] for r in rows]
    highs = [rank_interval(r)[1] for r in rows]
    ax.barh(
        y,
        values,
        # A percentile interval need not contain the mean; an error bar cannot be negative.
        xerr=[[max(v - lo, 0.0) for v, lo in zip(values, lows)], [max(hi - v, 0.0) for v, hi in zip(values, highs)]],
        color=["0.7" if r["contaminated"] else _COLORS[r["source"]] for r in rows],
        capsize=3,
    )
    for column, marker, color, name in (
        (f"max_at_k_{RANK_METRIC}", "^", "black", "Max@K"),
        (f"repeated_{RANK_METRIC}", "D", "tab:orange", "repeated (≥ 2 of K)"),
    ):
        points = [(r[column], i) for i, r in zip(y, rows) if r.get(column) is not None]
        if points:
            ax.scatter(*zip(*points), marker=marker, color=color, s=24, zorder=3, label=name)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_xlabel("second-level F1 (%), mean with 95% bootstrap interval over queries")
    ax.set_xlim(0, 100)


def _figure(height_rows: int) -> Figure:
    return Figure(figsize=(9, 1.2 + 0.35 * max(height_rows, 1)), dpi=100, layout="constrained")


def chart(board: pl.DataFrame) -> bytes:
    """PNG: second-level F1 with its 95% interval of every row of the newest month, in board order
    (RANK_RULE, printed under the chart); submissions green, contaminated rows grey."""
    with matplotlib.style.context("default"):
        # A bare Figure on an Agg canvas: no pyplot state in the Dagster process, no window.
        fig = _figure(board.height)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if board.is_empty():
            ax.set_axis_off()
            fig.text(0.5, 0.5, "no evaluation runs yet", ha="center", va="center", fontsize=16, color="0.4")
        else:
            month = board.get_column("month").max()
            rows = board.filter(pl.col("month") == month).to_dicts()  # already in rank order
            _draw(ax, rows, [_label(r) for r in rows])
            ax.set_title(f"Leaderboard {month}", fontsize=12)
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
    rc = {"svg.fonttype": "path", "svg.hashsalt": salt}
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        fig = _figure(len(rows))
        FigureCanvasSVG(fig)
        names = [visible_text(r["agent"]) for r in rows]  # as in the table beside it
        labels = [f"{r['rank']}. {n}" if r["rank"] else f"{n} (not ranked)" for r, n in zip(rows, names)]
        _draw(fig.add_subplot(), rows, labels)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML prolog and DOCTYPE, which HTML does not take


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
tr.submission td:nth-child(2) { font-style: italic; }
.ci { color: #666; font-size: 0.9em; }
.rule { max-width: 60em; color: #444; }
figure { margin: 0 0 1em 0; }
figure svg { max-width: 100%; height: auto; }
"""


def page(board: pl.DataFrame) -> bytes:
    """leaderboard.html: one section per month (newest first) and query set × distance, each a
    plot and a table, the ranking and interval rules stated. Self-contained (inline style, inline
    SVG; the CSP forbids any request) and free of the time it was made, so the same board gives
    the same bytes. Every text from a record is escaped: names and models come from submitters."""
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
        "(KL: lower is better).</p>",
        f'<p class="rule" id="rank-rule">{html.escape(RANK_RULE)}.</p>',
        f'<p class="rule">{html.escape(INTERVAL_RULE)}; {html.escape(AGGREGATION_RULE)}.</p>',
        '<p class="rule">Contaminated: the knowledge cutoff is not before the month, so the model may '
        "have seen its events; shown, never ranked.</p>",
    ]
    if board.is_empty():
        parts.append("<p>No evaluation runs or submissions yet.</p>")
    for (month,), month_rows in board.group_by("month", maintain_order=True):
        parts.append(f'<section id="month-{html.escape(month)}"><h2>{html.escape(month)}</h2>')
        for (query_set, distance), rows in month_rows.group_by("query_set", "distance", maintain_order=True):
            rows = rows.to_dicts()
            key = f"{month}-{query_set}-d{distance}"
            parts += [
                f'<section id="{html.escape(key)}" class="board">',
                f"<h3>{html.escape(query_set)}, distance {distance} day{'s' if distance != 1 else ''}</h3>",
                f"<figure>{section_svg(rows, key)}</figure>",
                "<table>",
                "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h, _ in _PAGE_COLUMNS) + "</tr></thead>",
                "<tbody>",
            ]
            for row in rows:
                classes = " ".join(c for c in (row["source"], "contaminated" if row["contaminated"] else "") if c)
                cells = "".join(f"<td>{cell(row)}</td>" for _, cell in _PAGE_COLUMNS)
                parts.append(f'<tr class="{classes}">{cells}</tr>')
            parts += ["</tbody>", "</table>", "</section>"]
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
