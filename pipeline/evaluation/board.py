"""The leaderboard's table: registered runs and submissions in one table, ranked by RANK_RULE.

``leaderboard`` reads every registered run (evaluations/…/scores.json with its results.parquet)
and every scored or contaminated submission (submissions/<name>/record.json, written by the
submission sensor) into one row each, ranked by the point estimate with a mark for the rows whose
interval overlaps the leader's (RANK_RULE); pipeline/evaluation/board_files.py
stores that table as evaluations/leaderboard.parquet and draws evaluations/leaderboard.png and
evaluations/leaderboard.html from it (docs/evaluation.md, "The leaderboard").

Every interval is scoring.bootstrap_intervals' percentile bootstrap over queries: a submission's
comes from its scorecard, a registered run's is drawn here from results.parquet's per-query
metrics (rounds averaged per query first, as scoring.per_query_scores does), with BOOTSTRAP_SEED
and scoring.DEFAULT_RESAMPLES, so both mean the same thing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.columns import Columns
from pipeline.evaluation.metrics import SET_METRIC_MEANINGS, SET_METRICS
from pipeline.evaluation.run import (
    AGGREGATE_COLUMNS,
    RANK_METRIC,
    TIEBREAK_METRICS,
    aggregation,
)
from pipeline.evaluation.scoring import DEFAULT_RESAMPLES, HIT_K, METRICS, bootstrap_intervals
from pipeline.markdown import markdown_text
from pipeline.release.layout import MAX_JSON_BYTES, is_month, shown
from pipeline.storage import DataLayout

SUBMISSIONS_DIR = "submissions"
RECORD_FILE = "record.json"
RECORD_FORMAT = "mirai-submission-record-v1"
RANK_DIGITS = 4  # scoring's precision (scoring._round): ranks compare the metrics as scorecards store them
BOOTSTRAP_SEED = 0  # scoring.score_predictions' default seed: `mirai score` gives the same intervals
SOURCES = ("registered", "submission")
# The columns of every row, before the metrics (<metric>, <metric>_std, <metric>_ci95_low/high).
KEY_COLUMNS = {
    "month": (pl.String, "Month of the test split evaluated (YYYY-MM)"),
    "query_set": (pl.String, "queries (the whole split) or queries_sample (MIRAI's balanced sample)"),
    "distance": (pl.Int64, "Days before t the agent could see events up to (t − distance)"),
    "agent": (pl.String, "A registered agent's name or a submission's name"),
    "source": (pl.String, "registered (evaluated here) or submission (scored from a submitted file)"),
    "kind": (pl.String, "baseline or llm for registered runs; null for submissions"),
    "model": (pl.String, "The model's name (or GGUF file); null for a baseline"),
    "knowledge_cutoff": (pl.String, "The model's knowledge cutoff (YYYY-MM-DD)"),
    "contaminated": (pl.Boolean, "Whether the knowledge cutoff is not before the month (such rows are not ranked)"),
    "n": (pl.Int64, "Queries scored"),
    "rounds": (pl.Int64, "Rounds K each query was run"),
    "mode": (pl.String, "native (our API) or mirai (MIRAI's own loop); null for a baseline"),
    "tools": (pl.String, "A ReAct agent's API subset: full, kg or news"),
    "action_type": (pl.String, "A ReAct agent's action type: single_function or code_block"),
}
# What each metric is (docs/evaluation.md; MIRAI's eval.py), in percent except the KL divergences.
METRIC_DESCRIPTIONS = {
    **{m: f"{meaning}, mean over queries" for m, meaning in SET_METRIC_MEANINGS.items()},
    "mrr": "Mean reciprocal rank of the first correct second-level code in the ranked list",
    f"hit_at_{HIT_K}": f"Share of queries with a correct second-level code in the top {HIT_K} of the ranked list",
}
_METRIC_SUFFIXES = {
    "": "{}",
    "_std": "{}: sample std over the rounds",
    "_ci95_low": "{}: 95% bootstrap interval's low end",
    "_ci95_high": "{}: 95% bootstrap interval's high end",
}


def _aggregate_description(column: str) -> str:
    """An across-round aggregate column's meaning (run.AGGREGATION_RULE)."""
    if column.startswith("max_at_k_"):
        return f"Max@K {column.removeprefix('max_at_k_')}: per query the round with the best second-level F1"
    if column.startswith("repeated_"):
        return f"{column.removeprefix('repeated_')} of the codes predicted in at least 2 of the K rounds"
    return {"avg_steps": "Mean ReAct steps per episode"}[column]


# After the metrics: cost and provenance, then the across-round aggregates.
TAIL_COLUMNS = {
    "tokens_in": (pl.Int64, "Prompt tokens over the run"),
    "tokens_out": (pl.Int64, "Completion tokens over the run"),
    "cost_usd": (pl.Float64, "Estimated cost in US dollars from the registry's token prices"),
    "code_version": (pl.String, "The pipeline's code version that evaluated the run; null for submissions"),
    "evaluated_at": (pl.String, "When the run was evaluated or the submission scored (ISO 8601, UTC)"),
    "aggregation": (pl.String, "What the row's metric columns are: rounds, and which aggregates it stored"),
    **{column: (pl.Float64, _aggregate_description(column)) for column in AGGREGATE_COLUMNS},
}
BOARD_COLUMNS = Columns(
    {
        "rank": (pl.UInt32, "Rank within month, query set and distance (1 = best); null when not ranked"),
        "overlaps_leader": (
            pl.Boolean,
            "Whether the row's 95% interval of second-level F1 overlaps its leader's (RANK_RULE); null if unranked",
        ),
        **KEY_COLUMNS,
        **{
            f"{m}{suffix}": (pl.Float64, template.format(METRIC_DESCRIPTIONS[m]))
            for m in METRICS
            for suffix, template in _METRIC_SUFFIXES.items()
        },
        **TAIL_COLUMNS,
    }
)
BOARD_SCHEMA = BOARD_COLUMNS.schema
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
    "overlaps_leader",
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


def rank_interval(row: Mapping) -> tuple[float, float]:
    """The row's 95% interval of RANK_METRIC; a run stored without results.parquet has none, and
    counts as the point interval at its mean."""
    low, high = row[f"{RANK_METRIC}_ci95_low"], row[f"{RANK_METRIC}_ci95_high"]
    value = row[RANK_METRIC]
    return (value, value) if low is None or high is None else (low, high)


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals share a point (touching counts)."""
    return a[0] <= b[1] and a[1] >= b[0]


def _scores(row: Mapping) -> tuple[float, ...]:
    """RANK_METRIC and the TIEBREAK_METRICS at the scorecards' precision (RANK_DIGITS), higher first:
    a submission's scorecard rounds to 4 decimals, so the same forecasts stored as a run and as a
    submission are equal here."""
    return tuple(-round(row[m] or 0.0, RANK_DIGITS) for m in (RANK_METRIC, *TIEBREAK_METRICS))


def _order_key(row: Mapping) -> tuple:
    return (*_scores(row), row["agent"], SOURCES.index(row["source"]))


def rank(rows: Iterable[dict]) -> list[dict]:
    """``rows`` in board order with ``rank`` and ``overlaps_leader`` set, per RANK_RULE: within each
    group (month desc, then query set and distance), the ranked rows (not contaminated, not 0 on
    RANK_METRIC and every TIEBREAK_METRIC) sorted by _order_key get the competition rank of their
    point estimates (1 + the rows with better scores: "1, 1, 3" for equal ones), and
    ``overlaps_leader`` says whether their 95% interval of RANK_METRIC overlaps the leader's (the
    first row). Then the unranked rows (both fields null): all-zero ones, then contaminated."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in GROUP), []).append(row)
    out = []
    # Newest month first (a stable sort by month after one by query set and distance).
    for key in sorted(sorted(groups, key=lambda k: (k[1], k[2])), key=lambda k: k[0], reverse=True):
        members = groups[key]
        scored = [r for r in members if any((r[m] or 0.0) > 0 for m in (RANK_METRIC, *TIEBREAK_METRICS))]
        ranked = sorted((r for r in scored if not r["contaminated"]), key=_order_key)
        previous: dict | None = None
        for position, row in enumerate(ranked, 1):
            place = previous["rank"] if previous and _scores(previous) == _scores(row) else position
            overlaps = intervals_overlap(rank_interval(row), rank_interval(ranked[0]))
            previous = row | {"rank": place, "overlaps_leader": overlaps}
            out.append(previous)
        ranked_ids = {id(r) for r in ranked}
        unranked = [r for r in members if id(r) not in ranked_ids]
        out += [
            r | {"rank": None, "overlaps_leader": None}
            for r in sorted(unranked, key=lambda r: (r["contaminated"], _order_key(r)))
        ]
    return out


def leaderboard(data_dir: Path | str) -> pl.DataFrame:
    """Every registered run and shown submission, one row each, ranked (``rank``; 1 = best) and
    ordered by RANK_RULE; columns BOARD_SCHEMA."""
    rows, _ = submission_rows(data_dir)
    return board_frame(registered_rows(data_dir) + rows)


def board_frame(rows: Iterable[dict]) -> pl.DataFrame:
    """The ranked rows as a frame with BOARD_SCHEMA's columns, in its order."""
    return pl.DataFrame(rank(rows), schema=BOARD_SCHEMA)


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


def summary(board: pl.DataFrame) -> pl.DataFrame:
    """The board's headline columns."""
    return board.select([c for c in SUMMARY_COLUMNS if c in board.columns])


def distance_title(query_set: str, distance: int) -> str:
    """A section's heading: each query set and distance is a board of its own."""
    return f"Distance {distance} day{'s' if distance != 1 else ''} · {query_set}"


def newest_sections(board: pl.DataFrame, top: int | None = None) -> list[tuple[str, pl.DataFrame]]:
    """The newest month's rows in board order, one (distance_title, rows) per query set and
    distance (at most ``top`` rows each): ranks are only comparable within one."""
    if board.is_empty():
        return []
    newest = board.filter(pl.col("month") == board.get_column("month").max())
    return [
        (f"{distance_title(query_set, distance)} · {month}", rows.head(top) if top else rows)
        for (month, query_set, distance), rows in newest.group_by(*GROUP, maintain_order=True)
    ]
