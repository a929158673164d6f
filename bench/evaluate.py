"""Baseline evaluation benchmark: 1,000 queries over a 14-month generated event database.

    flock /tmp/mirai-bench.lock .venv/bin/python bench/evaluate.py [--work DIR] [--rounds N]

Input. ``pipeline.mirror.database.generate_event_database`` writes 14 months (2023-01..2024-02,
seed 0, its default 5,000 quads a day, about 2 million events) under ``--work`` (default
``/tmp/mirai-bench-evaluate``); a re-run with the same parameters reuses them. The split's
queries come from the last month with ``pipeline.splits.queries_from_events`` at MIRAI's test
thresholds (≥ 100 daily mentions, ≥ 5 articles), and 1,000 of them are drawn with a fixed seed.

What is timed, per baseline in agents.yaml, in ``--rounds`` rounds (median and best printed):

* evaluate: ``evaluate_baseline`` end to end at distance 1 — reading the history files, the
  date-gated forecast of all 1,000 queries, MIRAI's metrics and MRR/Hit@10, and writing
  results.parquet and scores.json. Goal: ≤ 10 s per baseline.
* forecast: the forecast alone, from the lazily scanned history.

The load average is printed before and after, since the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date, timedelta
from pathlib import Path

from common import machine as machine_summary

import polars as pl

from pipeline.evaluation.baselines import default_top_k, forecast
from pipeline.evaluation.registry import load_agents
from pipeline.evaluation.run import evaluate_baseline, load_history
from pipeline.mirror.database import generate_event_database
from pipeline.splits import queries_from_events
from pipeline.storage import DataLayout

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
FIRST_MONTH = date(2023, 1, 1)
MONTHS = 14
LAST_MONTH = date(2024, 2, 1)
QUERIES = 1_000
DISTANCE = 1
GOAL_S = 10.0
DEFAULT_WORK = Path("/tmp/mirai-bench-evaluate")


def prepare(work: Path) -> dict:
    """Generate the database once; the marker file records what was generated."""
    marker = work / "generated.json"
    params = {"first_month": FIRST_MONTH.isoformat(), "months": MONTHS, "seed": SEED}
    if marker.exists() and json.loads(marker.read_text())["params"] == params:
        return json.loads(marker.read_text())["counts"]
    started = time.perf_counter()
    counts = generate_event_database(work, FIRST_MONTH, MONTHS, seed=SEED)
    print(f"generated {counts['events']:,} events in {time.perf_counter() - started:.1f} s")
    marker.write_text(json.dumps({"params": params, "counts": counts}))
    return counts


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    print(machine_summary({"polars": pl.__version__}))
    print(f"load average before: {load_average()}")
    counts = prepare(args.work)
    events = pl.read_parquet(DataLayout(args.work).database_path("events", LAST_MONTH))
    split = queries_from_events(events, LAST_MONTH, min_mentions=100, min_articles=5)
    queries = split.sample(QUERIES, seed=SEED).sort("query_id")
    print(f"history: {counts['events']:,} events over {MONTHS} months; {queries.height:,} of {split.height:,} queries")

    history = load_history(args.work, queries.get_column("date").max() - timedelta(days=DISTANCE))
    worst = 0.0
    for agent in load_agents(ROOT / "agents.yaml"):
        top_k = agent.top_k or (default_top_k(queries, history, DISTANCE) if agent.baseline == "frequency" else None)
        evaluate_s, forecast_s = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            _, record = evaluate_baseline(queries, args.work, agent, DISTANCE, query_set="bench")
            evaluate_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            forecast(agent.baseline, queries, history, distance_days=DISTANCE, top_k=top_k)
            forecast_s.append(time.perf_counter() - started)
        worst = max(worst, statistics.median(evaluate_s))
        metrics = record["metrics"]
        print(
            f"{agent.name:<11} evaluate median {statistics.median(evaluate_s):6.3f} s (best {min(evaluate_s):.3f})"
            f" | forecast median {statistics.median(forecast_s):6.3f} s (best {min(forecast_s):.3f})"
            f" | L2 F1 {metrics['level2_f1']:5.1f}  L1 F1 {metrics['level1_f1']:5.1f}  MRR {metrics['mrr']:5.1f}"
            f"  Hit@10 {metrics['hit_at_10']:5.1f}  quad KL {metrics['quad_kl']:5.2f}"
        )
    print(f"load average after: {load_average()}")
    verdict = "OK" if worst <= GOAL_S else "OVER GOAL"
    print(f"slowest baseline median {worst:.3f} s against a goal of {GOAL_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
