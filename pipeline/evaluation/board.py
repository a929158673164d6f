"""The published leaderboard: registered runs and submissions in one table, ranked by RANK_RULE.

``leaderboard`` reads every registered run (evaluations/…/scores.json with its results.parquet)
and every scored or contaminated submission (submissions/<name>/record.json, written by the
submission sensor) into one row each; ``write_leaderboard`` stores that table as
evaluations/leaderboard.parquet and draws evaluations/leaderboard.png (the newest month) and
evaluations/leaderboard.html (every month, table and plots inline). The same inputs give the same
bytes in all three (docs/evaluation.md, "The leaderboard").

Every interval is scoring.bootstrap_intervals' percentile bootstrap over queries: a submission's
comes from its scorecard, a registered run's is drawn here from results.parquet's per-query
metrics (rounds averaged per query first, as scoring.per_query_scores does), with BOOTSTRAP_SEED
and scoring.DEFAULT_RESAMPLES, so both mean the same thing.
"""

from __future__ import annotations

import html
import io
import json
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import matplotlib
import matplotlib.style
import numpy as np
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from pipeline.evaluation.metrics import SET_METRICS
from pipeline.evaluation.run import (
    AGGREGATE_COLUMNS,
    AGGREGATION_RULE,
    RANK_METRIC,
    RANK_RULE,
    TIEBREAK_METRICS,
    aggregation,
)
from pipeline.evaluation.scoring import DEFAULT_RESAMPLES, HIT_K, METRICS, bootstrap_intervals
from pipeline.markdown import html_text, markdown_text, visible_text
from pipeline.release.layout import MAX_JSON_BYTES, is_month, shown
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet

BOARD_FILE = "leaderboard.parquet"
CHART_FILE = "leaderboard.png"
PAGE_FILE = "leaderboard.html"
SUBMISSIONS_DIR = "submissions"
RECORD_FILE = "record.json"
RECORD_FORMAT = "mirai-submission-record-v1"
BOOTSTRAP_SEED = 0  # scoring.score_predictions' default seed: `mirai score` gives the same intervals
SOURCES = ("registered", "submission")
# The columns of every row, before the metrics (<metric>, <metric>_std, <metric>_ci95_low/high).
KEY_SCHEMA = {
    "month": pl.String,
    "query_set": pl.String,
    "distance": pl.Int64,
    "agent": pl.String,  # a registered agent's name or a submission's name
    "source": pl.String,  # registered | submission
    "kind": pl.String,  # baseline | llm for registered runs; null for submissions
    "model": pl.String,
    "knowledge_cutoff": pl.String,
    "contaminated": pl.Boolean,
    "n": pl.Int64,
    "rounds": pl.Int64,
    "mode": pl.String,
    "tools": pl.String,
    "action_type": pl.String,
}
# After the metrics: cost and provenance, then the across-round aggregates.
TAIL_SCHEMA = {
    "tokens_in": pl.Int64,
    "tokens_out": pl.Int64,
    "cost_usd": pl.Float64,
    "code_version": pl.String,
    "evaluated_at": pl.String,
    "aggregation": pl.String,
    **dict.fromkeys(AGGREGATE_COLUMNS, pl.Float64),
}
BOARD_SCHEMA = {
    "rank": pl.UInt32,
    **KEY_SCHEMA,
    **{f"{m}{suffix}": pl.Float64 for m in METRICS for suffix in ("", "_std", "_ci95_low", "_ci95_high")},
    **TAIL_SCHEMA,
}
GROUP = ("month", "query_set", "distance")
# What the Dagster UI and the demo show of each row; the parquet file has every column.
SUMMARY_COLUMNS = (
    "rank",
    "month",
    "query_set",
    "distance",
    "agent",
    "source",
    "contaminated",
    "n",
    "rounds",
    "level2_f1",
    "level2_f1_ci95_low",
    "level2_f1_ci95_high",
    "level1_f1",
    "level2_precision",
    "level2_recall",
    "quad_kl",
    "mrr",
    "tokens_in",
    "tokens_out",
    "cost_usd",
    "mode",
    "action_type",
    # The across-round aggregates (run.AGGREGATION_RULE), and what each row's columns are.
    "max_at_k_level2_f1",
    "repeated_level2_f1",
    "avg_steps",
    "aggregation",
)
INTERVAL_RULE = (
    f"intervals: 95% percentile bootstrap over queries ({DEFAULT_RESAMPLES} resamples; a query's score is its "
    f"mean over rounds); registered runs use seed {BOOTSTRAP_SEED}, submissions the seed in their scorecard"
)


# --- registered runs --------------------------------------------------------------------------------


def run_intervals(results: Path, seed: int = BOOTSTRAP_SEED, resamples: int = DEFAULT_RESAMPLES) -> dict | None:
    """{metric: (low, high)} for scoring.METRICS from a run's results.parquet (one row per query
    and round): each query's metrics averaged over its rounds, MRR and Hit@10 in percent (as
    scoring.per_query_scores), then scoring.bootstrap_intervals. None when the file is absent."""
    if not results.is_file():
        return None
    hit = f"hit_at_{HIT_K}"
    per_query = (
        pl.read_parquet(results, columns=["query_id", *SET_METRICS, "reciprocal_rank", hit])
        .group_by("query_id", maintain_order=True)
        .agg(
            *(pl.col(m).mean() for m in SET_METRICS),
            (pl.col("reciprocal_rank").mean() * 100).alias("mrr"),
            pl.col(hit).mean() * 100,
        )
        .select(METRICS)
    )
    low, high = bootstrap_intervals(per_query.to_numpy().astype(float), seed, resamples)
    return {m: (float(low[i]), float(high[i])) for i, m in enumerate(METRICS)}


def _model_name(record: Mapping) -> str | None:
    model = record.get("model")
    if not isinstance(model, Mapping):
        return None
    return model.get("model") or model.get("gguf")


def _aggregate_cells(record: Mapping) -> dict:
    best, repeated = record.get("max_at_k") or {}, record.get("repeated") or {}
    return (
        {"aggregation": aggregation(record)}
        | {c: best.get(c.removeprefix("max_at_k_")) for c in AGGREGATE_COLUMNS if c.startswith("max_at_k_")}
        | {c: repeated.get(c.removeprefix("repeated_")) for c in AGGREGATE_COLUMNS if c.startswith("repeated_")}
        | {"avg_steps": record.get("avg_steps")}
    )


def run_row(record: Mapping, intervals: Mapping[str, tuple[float, float]] | None) -> dict:
    """A registered run's row from its scores.json. Runs stored before mode and tools were
    recorded ran the native harness with the full API (or, for a baseline or Direct/CoT agent,
    without either); the action type is a ReAct agent's (None for the others)."""
    llm = record["kind"] == "llm"
    react = llm and record.get("strategy") == "react"
    metrics, std = record["metrics"], record["metrics_std"]
    row = {
        "month": record["month"],
        "query_set": record["query_set"],
        "distance": record["distance"],
        "agent": record["agent"],
        "source": "registered",
        "kind": record["kind"],
        "model": _model_name(record),
        "knowledge_cutoff": record.get("knowledge_cutoff"),
        "contaminated": record["contaminated"],
        "n": record["n"],
        "rounds": record["rounds"],
        "mode": record.get("mode", "native" if llm else None),
        "tools": record.get("tools", "full" if react else None),
        "action_type": record.get("action_type") if react else None,
    }
    for m in METRICS:
        low, high = intervals[m] if intervals else (None, None)
        row |= {m: metrics.get(m), f"{m}_std": std.get(m), f"{m}_ci95_low": low, f"{m}_ci95_high": high}
    return row | {
        "tokens_in": record.get("tokens_in"),
        "tokens_out": record.get("tokens_out"),
        "cost_usd": record.get("cost_usd"),
        "code_version": record.get("code_version"),
        "evaluated_at": record.get("evaluated_at"),
        **_aggregate_cells(record),
    }


def registered_rows(data_dir: Path | str) -> list[dict]:
    """One row per stored run (scores.json), with its bootstrap intervals."""
    rows = []
    for path in sorted((DataLayout(data_dir).root / "evaluations").glob("*/*/*/distance=*/scores.json")):
        rows.append(run_row(json.loads(path.read_text()), run_intervals(path.parent / "results.parquet")))
    return rows


# --- submissions ------------------------------------------------------------------------------------


class BadRecord(ValueError):
    """A record.json the board cannot show; the message says which field."""


def _field(record: Mapping, key: str, kind: type | tuple[type, ...], *, optional: bool = False):
    value = record.get(key)
    if value is None and optional:
        return None
    # bool is an int in Python; no field here is a boolean.
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadRecord(f"{key} is {shown(value)}, not {getattr(kind, '__name__', kind)}")
    return value


def submission_row(record: object, name: str) -> dict | None:
    """A submission's row from its record.json (the shared format in docs/evaluation.md), or None
    for a rejected one. Every field is checked: the record holds what a submitter wrote (model,
    cutoff, …), so a wrong type is refused with BadRecord, never shown half-read. Contaminated is
    the record's status or, whatever it says, a cutoff not before the month (registry.eligibility)."""
    if not isinstance(record, Mapping) or record.get("format") != RECORD_FORMAT:
        raise BadRecord(f"not a {RECORD_FORMAT} record")
    status = record.get("status")
    if status == "rejected":
        return None
    if status not in ("scored", "contaminated"):
        raise BadRecord(f"status is {shown(status)}")
    if record.get("submission") != name:
        raise BadRecord(f"submission {shown(record.get('submission'))} is not its directory's name")
    month = _field(record, "month", str)
    if not is_month(month):
        raise BadRecord(f"month {shown(month)} is not YYYY-MM")
    try:
        cutoff = date.fromisoformat(_field(record, "knowledge_cutoff", str))
    except ValueError:
        raise BadRecord(f"knowledge_cutoff {shown(record['knowledge_cutoff'])} is not a date") from None
    query_set = _field(record, "query_set", str)
    if query_set not in ("queries", "queries_sample"):
        raise BadRecord(f"query_set {shown(query_set)}")
    distance, rounds = _field(record, "distance", int), _field(record, "rounds", int)
    if distance < 0 or rounds < 1:
        raise BadRecord(f"distance {distance} or rounds {rounds} out of range")
    card = _field(record, "scorecard", Mapping)
    n = _field(card, "queries", int)
    split = card.get("split")
    if not isinstance(split, Mapping) or split.get("query_set") != query_set:
        raise BadRecord("the scorecard was not made for the record's query set")
    scored = card.get("metrics")
    if not isinstance(scored, Mapping):
        raise BadRecord("the scorecard has no metrics")
    row = {
        "month": month,
        "query_set": query_set,
        "distance": distance,
        "agent": name,
        "source": "submission",
        "kind": None,
        "model": _field(record, "model", str),
        "knowledge_cutoff": cutoff.isoformat(),
        "contaminated": status == "contaminated" or cutoff >= date.fromisoformat(f"{month}-01"),
        "n": n,
        "rounds": rounds,
        "mode": _field(record, "api_mode", str, optional=True),
        "tools": None,
        "action_type": _field(record, "action_type", str, optional=True),
    }
    for m in METRICS:
        entry = scored.get(m)
        try:
            value, (low, high) = float(entry["value"]), map(float, entry["ci95"])
        except (TypeError, KeyError, ValueError):
            raise BadRecord(f"the scorecard's {m} is not a value with a ci95 pair") from None
        if not all(np.isfinite([value, low, high])):
            raise BadRecord(f"the scorecard's {m} is not finite")
        row |= {m: value, f"{m}_std": None, f"{m}_ci95_low": low, f"{m}_ci95_high": high}
    cost = _field(record, "cost_usd", (int, float), optional=True)
    return row | {
        "tokens_in": _field(record, "tokens_in", int, optional=True),
        "tokens_out": _field(record, "tokens_out", int, optional=True),
        "cost_usd": None if cost is None else float(cost),
        "code_version": None,
        "evaluated_at": _field(record, "scored_at", str, optional=True),
        "aggregation": f"mean of {rounds} rounds per query, then over queries" if rounds > 1 else "1 round",
        **dict.fromkeys(AGGREGATE_COLUMNS),
    }


def submission_rows(data_dir: Path | str) -> tuple[list[dict], list[str]]:
    """The rows of every scored or contaminated submission, and one line per record.json that
    could not be shown (unreadable, too large, or not the shared format); a bad record never
    hides the others."""
    rows, skipped = [], []
    for path in sorted((DataLayout(data_dir).root / SUBMISSIONS_DIR).glob(f"*/{RECORD_FILE}")):
        name = path.parent.name
        try:
            if path.is_symlink() or path.stat().st_size > MAX_JSON_BYTES:
                raise BadRecord(f"a link or larger than {MAX_JSON_BYTES} bytes")
            row = submission_row(json.loads(path.read_bytes()), name)
        except (BadRecord, ValueError, RecursionError) as exc:
            skipped.append(f"{shown(name)}: {str(exc)[:200]}")
            continue
        if row is not None:
            rows.append(row)
    return rows, skipped


# --- ranking ----------------------------------------------------------------------------------------


def _interval(row: Mapping) -> tuple[float, float]:
    """The row's 95% interval of RANK_METRIC; a run stored without results.parquet has none, and
    counts as the point interval at its mean."""
    low, high = row[f"{RANK_METRIC}_ci95_low"], row[f"{RANK_METRIC}_ci95_high"]
    value = row[RANK_METRIC]
    return (value, value) if low is None or high is None else (low, high)


def _order_key(row: Mapping) -> tuple:
    return (
        -row[RANK_METRIC],
        *(-(row[m] or 0.0) for m in TIEBREAK_METRICS),
        row["agent"],
        SOURCES.index(row["source"]),
    )


def rank(rows: Iterable[dict]) -> list[dict]:
    """``rows`` in board order with ``rank`` set, per RANK_RULE: within each group (month desc,
    then query set and distance), the ranked rows (not contaminated, not 0 on RANK_METRIC and every
    TIEBREAK_METRIC) sorted by _order_key form tiers: each row joins the current tier when its
    interval overlaps the tier's first row's, and shares its rank; otherwise it opens a new tier
    whose rank is its 1-based position. Then the unranked rows: all-zero ones, then contaminated."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in GROUP), []).append(row)
    out = []
    # Newest month first (a stable sort by month after one by query set and distance).
    for key in sorted(sorted(groups, key=lambda k: (k[1], k[2])), key=lambda k: k[0], reverse=True):
        members = groups[key]
        scored = [r for r in members if any((r[m] or 0.0) > 0 for m in (RANK_METRIC, *TIEBREAK_METRICS))]
        ranked = sorted((r for r in scored if not r["contaminated"]), key=_order_key)
        leader = None
        for position, row in enumerate(ranked, 1):
            if leader is not None:
                low, high = _interval(row)
                leader_low, leader_high = _interval(leader)
                if low <= leader_high and high >= leader_low:
                    out.append(row | {"rank": leader["rank"]})
                    continue
            leader = row | {"rank": position}
            out.append(leader)
        ranked_ids = {id(r) for r in ranked}
        unranked = [r for r in members if id(r) not in ranked_ids]
        out += [r | {"rank": None} for r in sorted(unranked, key=lambda r: (r["contaminated"], _order_key(r)))]
    return out


def leaderboard(data_dir: Path | str) -> pl.DataFrame:
    """Every registered run and shown submission, one row each, ranked (``rank``; 1 = best) and
    ordered by RANK_RULE; columns BOARD_SCHEMA."""
    rows, _ = submission_rows(data_dir)
    return board_frame(registered_rows(data_dir) + rows)


def board_frame(rows: Iterable[dict]) -> pl.DataFrame:
    """The ranked rows as a frame with BOARD_SCHEMA's columns, in its order."""
    return pl.DataFrame(rank(rows), schema=BOARD_SCHEMA)


# --- rendering ----------------------------------------------------------------------------------------

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
    lows = [_interval(r)[0] for r in rows]
    highs = [_interval(r)[1] for r in rows]
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


def markdown_table(frame: pl.DataFrame) -> str:
    """A markdown table (floats to 2 decimals, booleans yes/no, nulls blank) for Dagster metadata;
    text cells are inert Markdown (pipeline.markdown: names and models come from submitters)."""

    def cell(value) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value) if isinstance(value, int) else markdown_text(str(value))

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines)


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


def summary(board: pl.DataFrame) -> pl.DataFrame:
    """The board's headline columns."""
    return board.select([c for c in SUMMARY_COLUMNS if c in board.columns])
