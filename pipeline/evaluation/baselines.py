"""Forecasters that need no model: the floors an LLM agent has to beat (MIRAI, arXiv:2407.01231,
Appendix D.8).

Each takes the split's queries (query_id, date, s, o) and the event history (date, s, r, o rows
of the event database) and returns, per query, a ranked list of second-level codes and the answer
dict that is scored as the set prediction (FORECAST_SCHEMA). A query sees only the events an agent
would see: dated on or before t − distance_days (``visible_history``, the same gate as MIRAI's
``set_default_end_date(query_date − timediff)``). All queries are answered in one lazy
join/group_by pass over the history, never a Python loop over it.
"""

from __future__ import annotations

import json
from datetime import timedelta

import polars as pl

from pipeline.evaluation.metrics import to_answer_dict

FORECAST_SCHEMA = pl.Schema(
    [
        ("query_id", pl.String),
        ("ranked", pl.List(pl.String)),  # second-level codes, best first
        ("answer_dict", pl.String),  # JSON {"04": ["042"], ...}: the set prediction that is scored
    ]
)


def visible_history(queries: pl.DataFrame, history: pl.LazyFrame | pl.DataFrame, distance_days: int) -> pl.LazyFrame:
    """(query_id, r, date): every s→o event dated ≤ t − distance_days, for each query (t, s, o).
    An event on day t − distance_days + 1 or later is never visible."""
    if distance_days < 1:
        raise ValueError(
            f"distance_days must be at least 1 (the query day itself is never visible), got {distance_days}"
        )
    gates = queries.lazy().select(
        "query_id", "s", "o", (pl.col("date") - pl.duration(days=distance_days)).alias("cutoff")
    )
    return (
        gates.join(history.lazy().select("date", "s", "o", "r"), on=["s", "o"], how="inner")
        .filter(pl.col("date") <= pl.col("cutoff"))
        .select("query_id", "r", "date")
    )


def _relation_stats(queries: pl.DataFrame, history: pl.LazyFrame | pl.DataFrame, distance_days: int) -> pl.LazyFrame:
    """Per (query, relation): the last visible day it occurred and on how many visible days (the
    event database holds one row per (date, s, r, o), so rows are days)."""
    return (
        visible_history(queries, history, distance_days)
        .group_by("query_id", "r")
        .agg(pl.col("date").max().alias("last_seen"), pl.len().alias("days"))
    )


def _forecasts(queries: pl.DataFrame, lists: pl.LazyFrame) -> pl.DataFrame:
    """FORECAST_SCHEMA rows for every query, in query order, from (query_id, ranked) rows; a query
    with no visible history gets an empty list and {}."""
    frame = (
        queries.select("query_id")
        .join(lists.collect(), on="query_id", how="left", maintain_order="left")
        .with_columns(pl.col("ranked").fill_null(pl.lit([], dtype=pl.List(pl.String))))
    )
    dicts = [json.dumps(to_answer_dict(codes), sort_keys=True) for codes in frame.get_column("ranked").to_list()]
    return frame.with_columns(pl.Series("answer_dict", dicts, dtype=pl.String)).match_to_schema(FORECAST_SCHEMA)


def recurrency(queries: pl.DataFrame, history: pl.LazyFrame | pl.DataFrame, *, distance_days: int = 1) -> pl.DataFrame:
    """Recurrency, strict variant (Gastinger et al. 2024, adapted to relation prediction in MIRAI
    D.8.2, eq. 1): relation r scores Δ(t, k) = k/t with k the last visible day (s, r, o) occurred,
    0 when it never did. For one query t is fixed, so the ranking is by last occurrence, most
    recent first; D.8 leaves ties open, and we break them by the number of visible days, then by
    code. The set prediction is every relation with a non-zero score (every relation s ever took
    toward o in the visible history): that is what gives D.8's Recurrency its high second-level
    recall (≈80%) and low precision (≈14%)."""
    lists = (
        _relation_stats(queries, history, distance_days)
        .group_by("query_id")
        .agg(pl.col("r").sort_by(["last_seen", "days", "r"], descending=[True, True, False]).alias("ranked"))
    )
    return _forecasts(queries, lists)


def default_top_k(queries: pl.DataFrame, history: pl.LazyFrame | pl.DataFrame, distance_days: int = 1) -> int:
    """How many relations a pair takes on a day it is active, on average (rounded, at least 1),
    over the history every query may see (dated ≤ the earliest t − distance_days): the size a
    frequency forecast should have, learnt without looking at any answer."""
    cutoff = queries.get_column("date").min() - timedelta(days=distance_days)
    mean = (
        history.lazy()
        .filter(pl.col("date") <= cutoff)
        .group_by("date", "s", "o")
        .agg(pl.len().alias("relations"))
        .select(pl.col("relations").mean())
        .collect()
        .item()
    )
    return max(1, round(mean)) if mean is not None else 1


def frequency(
    queries: pl.DataFrame, history: pl.LazyFrame | pl.DataFrame, *, distance_days: int = 1, k: int | None = None
) -> pl.DataFrame:
    """Historical frequency: the k relations s took toward o on the most visible days, ties broken
    by the most recent occurrence, then by code. k defaults to ``default_top_k``."""
    if k is None:
        k = default_top_k(queries, history, distance_days)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    lists = (
        _relation_stats(queries, history, distance_days)
        .group_by("query_id")
        .agg(pl.col("r").sort_by(["days", "last_seen", "r"], descending=[True, True, False]).head(k).alias("ranked"))
    )
    return _forecasts(queries, lists)


def empty(queries: pl.DataFrame) -> pl.DataFrame:
    """The floor: no relation for any query (MIRAI's KL for it is ≈23, every P/R/F1 is 0)."""
    return _forecasts(queries, pl.LazyFrame(schema={"query_id": pl.String, "ranked": pl.List(pl.String)}))


BASELINE_METHODS = ("recurrency", "frequency", "empty")


def forecast(
    method: str,
    queries: pl.DataFrame,
    history: pl.LazyFrame | pl.DataFrame,
    *,
    distance_days: int,
    top_k: int | None = None,
) -> pl.DataFrame:
    """Run the named baseline (one of BASELINE_METHODS); top_k applies to ``frequency`` only."""
    if method == "recurrency":
        return recurrency(queries, history, distance_days=distance_days)
    if method == "frequency":
        return frequency(queries, history, distance_days=distance_days, k=top_k)
    if method == "empty":
        return empty(queries)
    raise ValueError(f"unknown baseline {method!r}; expected one of {BASELINE_METHODS}")
