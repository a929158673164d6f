"""Evaluation runs: forecast a split's queries, score them, store the record; and the leaderboard.

One run = one agent × one month × one query set (``queries`` or ``queries_sample``) × one distance,
stored as a directory ``evaluations/YYYY-MM/<agent>/<query_set>/distance=<d>/`` holding

- ``results.parquet``: per query its gold and predicted answer dicts, the ranked list and every
  per-query metric;
- ``scores.json``: the metrics (mean and std over rounds), agent, month, distance, the
  contamination flag with its reason, and the code version.

The directory is built aside and swapped in whole, so a reader never pairs new results with old
scores. ``leaderboard`` collects every scores.json; contaminated runs are listed but never ranked.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.database import MonthNotReady
from pipeline.evaluation.baselines import default_top_k, forecast
from pipeline.evaluation.metrics import (
    SET_METRICS,
    aggregate_rounds,
    hit,
    hit_at_k,
    mrr,
    query_scores,
    reciprocal_rank,
    score,
)
from pipeline.evaluation.registry import Agent, eligibility
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    replace_dir,
)
from pipeline.version import code_version

EVALUATION_VERSION = "evaluation-v1"
RANK_METRIC = "level2_f1"
HIT_K = 10  # Hit@10, as in MIRAI Appendix D.8
_MONTH_FILE = re.compile(r"^month=(\d{4})-(\d{2})\.parquet$")


class NotEligible(RuntimeError):
    """The agent's knowledge cutoff is not before the month; the message says why."""


def load_queries(source: pl.DataFrame | Path | str, query_set: str | None = None) -> tuple[pl.DataFrame, str]:
    """The queries and the name of their set: a split directory means its queries.parquet, a
    parquet file is named by its stem (queries_sample), a frame by ``query_set`` (default
    "queries")."""
    if isinstance(source, pl.DataFrame):
        return source, query_set or "queries"
    path = Path(source)
    if path.is_dir():
        path = path / "queries.parquet"
    return pl.read_parquet(path), query_set or path.stem


def split_month(queries: pl.DataFrame) -> date:
    """The one month every query falls in."""
    months = queries.select(pl.col("date").dt.truncate("1mo").unique()).to_series().to_list()
    if len(months) != 1:
        raise ValueError(f"queries must come from one month, found {sorted(months) or 'none'}")
    return months[0]


def load_history(data_dir: Path | str, until: date) -> pl.LazyFrame:
    """(date, s, r, o) of every event in the event database dated on or before ``until``; only
    the monthly files that can hold such events are read."""
    directory = DataLayout(data_dir).database_dir() / "events"
    paths = sorted(
        path
        for path in directory.glob("month=*.parquet")
        if (m := _MONTH_FILE.match(path.name)) and date(int(m[1]), int(m[2]), 1) <= until
    )
    if not paths:
        raise MonthNotReady(f"no event database month up to {until} under {directory}; materialise event_database first")
    return pl.scan_parquet(paths).select("date", "s", "r", "o").filter(pl.col("date") <= until)


def admit(agent: Agent, month: date, force: bool) -> tuple[bool, str]:
    """(contaminated, reason): an ineligible agent runs only when forced, and is then flagged."""
    eligible, reason = eligibility(agent, month)
    if not eligible and not force:
        raise NotEligible(f"{agent.name} on {month:%Y-%m}: {reason} (force the run to store it as contaminated)")
    return not eligible, reason


def score_forecasts(queries: pl.DataFrame, forecasts: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, float]]:
    """Per-query results (query, gold, prediction, ranked list, every per-query metric) and the
    averaged metrics: MIRAI's set metrics plus MRR and Hit@10 of the ranked lists."""
    frame = queries.select("query_id", "date", "s", "o", pl.col("answer_dict").alias("gold")).join(
        forecasts.select("query_id", pl.col("answer_dict").alias("prediction"), "ranked"),
        on="query_id",
        how="left",
        maintain_order="left",
    )
    if frame.get_column("prediction").null_count():
        raise ValueError("some queries have no forecast")
    answers = [json.loads(a) for a in frame.get_column("gold")]
    predictions = [json.loads(p) for p in frame.get_column("prediction")]
    rankings = frame.get_column("ranked").to_list()
    per_query = pl.DataFrame(
        [
            query_scores(p, a) | {"reciprocal_rank": reciprocal_rank(r, a), f"hit_at_{HIT_K}": hit(r, a, HIT_K)}
            for p, a, r in zip(predictions, answers, rankings)
        ],
        schema=dict.fromkeys([*SET_METRICS, "reciprocal_rank", f"hit_at_{HIT_K}"], pl.Float64),
    )
    metrics = score(predictions, answers) | {
        "mrr": mrr(rankings, answers),
        f"hit_at_{HIT_K}": hit_at_k(rankings, answers, HIT_K),
    }
    return pl.concat([frame, per_query], how="horizontal"), metrics


def write_evaluation(directory: Path, results: pl.DataFrame, record: dict) -> dict:
    """Write results.parquet and scores.json into a staging directory and swap it into place;
    return the record as stored (with the sha256 of results.parquet)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        atomic_write_parquet(results, staging / "results.parquet", metadata={"evaluation_version": EVALUATION_VERSION})
        record = record | {"results_sha256": hashlib.sha256((staging / "results.parquet").read_bytes()).hexdigest()}
        atomic_write_bytes(staging / "scores.json", (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        replace_dir(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def evaluate_baseline(
    queries: pl.DataFrame | Path | str,
    data_dir: Path | str,
    agent: Agent,
    distance: int,
    *,
    query_set: str | None = None,
    force: bool = False,
) -> tuple[pl.DataFrame, dict]:
    """Forecast every query with a model-free baseline from the history visible at distance
    ``distance`` days, score it, and store the run (see the module doc). Returns the per-query
    results and the scores record."""
    if agent.kind != "baseline":
        raise ValueError(f"{agent.name} is a {agent.kind} agent, not a baseline")
    frame, query_set = load_queries(queries, query_set)
    month = split_month(frame)
    contaminated, reason = admit(agent, month, force)
    history = load_history(data_dir, frame.get_column("date").max() - timedelta(days=distance))
    top_k = agent.top_k
    if agent.baseline == "frequency" and top_k is None:
        top_k = default_top_k(frame, history, distance)
    forecasts = forecast(agent.baseline, frame, history, distance_days=distance, top_k=top_k)
    results, metrics = score_forecasts(frame, forecasts)
    rounds = aggregate_rounds([metrics])
    record = {
        "agent": agent.name,
        "kind": agent.kind,
        "baseline": agent.baseline,
        "top_k": top_k,
        "month": f"{month:%Y-%m}",
        "query_set": query_set,
        "distance": distance,
        "n": rounds["n"],
        "rounds": rounds["rounds"],
        "metrics": rounds["mean"],
        "metrics_std": rounds["std"],
        "knowledge_cutoff": agent.knowledge_cutoff.isoformat() if agent.knowledge_cutoff else None,
        "contaminated": contaminated,
        "eligibility": reason,
        "code_version": code_version(),
        "evaluation_version": EVALUATION_VERSION,
        "evaluated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return results, write_evaluation(DataLayout(data_dir).evaluation_dir(month, agent.name, query_set, distance), results, record)


# The columns every leaderboard row has before its metrics.
_BOARD_SCHEMA = {
    "month": pl.String,
    "query_set": pl.String,
    "distance": pl.Int64,
    "agent": pl.String,
    "kind": pl.String,
    "contaminated": pl.Boolean,
    "n": pl.Int64,
    "rounds": pl.Int64,
}


def leaderboard(data_dir: Path | str) -> pl.DataFrame:
    """One row per stored run: its keys, every metric (mean, and ``<metric>_std``), the code
    version; ``rank`` orders the uncontaminated runs of each (month, query_set, distance) by
    second-level F1 (1 = best, ties share a rank) and is null for contaminated runs."""
    rows = []
    for path in sorted((DataLayout(data_dir).root / "evaluations").glob("*/*/*/distance=*/scores.json")):
        record = json.loads(path.read_text())
        rows.append(
            {key: record[key] for key in _BOARD_SCHEMA}
            | record["metrics"]
            | {f"{m}_std": v for m, v in record["metrics_std"].items()}
            | {"code_version": record["code_version"], "evaluated_at": record["evaluated_at"]}
        )
    if not rows:
        return pl.DataFrame(schema={"rank": pl.UInt32, **_BOARD_SCHEMA})
    group = ["month", "query_set", "distance"]
    rankable = pl.when(pl.col("contaminated")).then(None).otherwise(pl.col(RANK_METRIC))
    return (
        pl.DataFrame(rows, infer_schema_length=None)
        .with_columns(rankable.rank("min", descending=True).over(group).cast(pl.UInt32).alias("rank"))
        .sort([*group, "rank", "agent"], descending=[True, False, False, False, False], nulls_last=True)
        .select("rank", pl.exclude("rank"))
    )
