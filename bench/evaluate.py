"""Baseline evaluation benchmark: 1,000 queries over a 14-month generated event database.

    flock /tmp/mirai-bench.lock .venv/bin/python bench/evaluate.py [--work DIR] [--rounds N] [--harness-queries N]

Input. ``testbed.database.generate_event_database`` writes 14 months (2023-01..2024-02,
seed 0, its default 5,000 quads a day, about 2 million events) under ``--work`` (default
``/tmp/mirai-bench-evaluate``); a re-run with the same parameters reuses them. The split's
queries come from the last month with ``pipeline.splits.split.queries_from_events`` at MIRAI's test
thresholds (≥ 100 daily mentions, ≥ 5 articles), and 1,000 of them are drawn with a fixed seed.

What is timed, per baseline in agents.yaml, in ``--rounds`` rounds (median and best printed):

* evaluate: ``evaluate_baseline`` end to end at distance 1 — reading the history files, the
  date-gated forecast of all 1,000 queries, MIRAI's metrics and MRR/Hit@10, and writing
  results.parquet and scores.json. Goal: ≤ 10 s per baseline.
* forecast: the forecast alone, from the lazily scanned history.

ReAct harness overhead per step, excluding model time (goal ≤ 20 ms): ``run_react`` over the first
``--harness-queries`` queries of the split, for both action types, with a client that replies
instantly from a fixed script of typical API calls (the relation distribution, counts, events,
news titles, entity distribution, a BM25 event search, look-ups) and then a final answer. The
client clocks the gap between handing back reply i and being asked for reply i + 1: that is one
step of harness work (parsing the action, the sandbox round trip, building the next prompt).
The first step of each episode also starts the sandbox process, which maps the gated tables
(all 14 months), so it is reported apart.

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

import polars as pl

from common import machine as machine_summary
from pipeline.agent_api import EventDatabase
from pipeline.evaluation.agents import run_react
from pipeline.evaluation.baselines import default_top_k, forecast
from pipeline.evaluation.llm import Reply
from pipeline.evaluation.queries import load_history
from pipeline.evaluation.registry import load_agents
from pipeline.evaluation.run import evaluate_baseline
from pipeline.evaluation.trajectory import AgentSpec, Query
from pipeline.splits.split import queries_from_events
from pipeline.storage import DataLayout
from testbed.database import generate_event_database

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
FIRST_MONTH = date(2023, 1, 1)
MONTHS = 14
LAST_MONTH = date(2024, 2, 1)
QUERIES = 1_000
DISTANCE = 1
GOAL_S = 10.0
STEP_GOAL_MS = 20.0
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


def baselines(work: Path, queries: pl.DataFrame, rounds: int) -> None:
    history = load_history(work, queries.get_column("date").max() - timedelta(days=DISTANCE))
    worst = 0.0
    for agent in load_agents(ROOT / "agents.yaml"):
        top_k = agent.top_k or (default_top_k(queries, history, DISTANCE) if agent.baseline == "frequency" else None)
        evaluate_s, forecast_s = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            _, record = evaluate_baseline(queries, work, agent, DISTANCE, query_set="bench")
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
    verdict = "OK" if worst <= GOAL_S else "OVER GOAL"
    print(f"slowest baseline median {worst:.3f} s against a goal of {GOAL_S:.0f} s: {verdict}")


class ClockedClient:
    """Replies instantly from a script and records the harness time between consecutive calls."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.gaps: list[float] = []
        self._returned: float | None = None

    def chat(self, messages, *, temperature, max_tokens, stop) -> Reply:
        called = time.perf_counter()
        if self._returned is not None:
            self.gaps.append(called - self._returned)
        text = self.replies.pop(0)
        self._returned = time.perf_counter()
        return Reply(text, 0, 0, self._returned - called)


def _calls(query: Query, cutoff) -> list[str]:
    s, o = query.s, query.o
    month_ago = cutoff - timedelta(days=30)
    return [
        f'get_relation_distribution(head_entities=["{s}"], tail_entities=["{o}"])',
        f'count_events(date_range=DateRange("{month_ago}", "{cutoff}"), head_entities=["{s}"], tail_entities=["{o}"])',
        f'get_events(head_entities=["{s}"], tail_entities=["{o}"])',
        f'get_news_articles(head_entities=["{s}"], tail_entities=["{o}"])',
        f'get_entity_distribution(interacted_entities=["{o}"], entity_role="head")',
        f'get_events(head_entities=["{s}"], text_description="talks on trade and security")',
        f'map_country_name_to_iso("{query.o_name}")',
        'get_child_relations("04")',
    ]


def _script(query: Query, cutoff, action_type: str) -> list[str]:
    if action_type == "single_function":
        actions = [f"Thought: step {i}.\nAction: {call}" for i, call in enumerate(_calls(query, cutoff))]
    else:
        actions = [
            f"Thought: step {i}.\nAction:\n```python\nresult = {call}\nprint(result)\n```"
            for i, call in enumerate(_calls(query, cutoff))
        ]
    return [*actions, 'Thought: done.\nAction: Final Answer: {"04": ["042"]}']


def harness_overhead(work: Path, queries: pl.DataFrame) -> None:
    database = EventDatabase(work)
    items = [Query(*row) for row in queries.select("query_id", "date", "s", "o", "s_name", "o_name").iter_rows()]
    worst = 0.0
    for action_type in ("single_function", "code_block"):
        first, steady = [], []
        for query in items:
            cutoff = query.date - timedelta(days=DISTANCE)
            client = ClockedClient(_script(query, cutoff, action_type))
            spec = AgentSpec("react", action_type, 0.0, 20, 512)
            trajectory = run_react(
                client,
                spec,
                query,
                cutoff,
                lambda q=query: database.environment(q.date, DISTANCE),
                first_day=database.start,
            )
            assert trajectory.end_state == "final_answer", trajectory.end_state
            assert not any(step.error for step in trajectory.steps), [s.error for s in trajectory.steps if s.error]
            first.append(client.gaps[0])
            steady.extend(client.gaps[1:])
        median_ms, p90_ms = 1000 * statistics.median(steady), 1000 * statistics.quantiles(steady, n=10)[-1]
        worst = max(worst, median_ms)
        print(
            f"ReAct {action_type:<15} per step median {median_ms:6.1f} ms, p90 {p90_ms:6.1f} ms, max {1000 * max(steady):6.1f} ms"
            f" ({len(steady)} steps) | first step (starts the sandbox) median {statistics.median(first):.2f} s"
        )
    verdict = "OK" if worst <= STEP_GOAL_MS else "OVER GOAL"
    print(f"slowest ReAct step median {worst:.1f} ms against a goal of {STEP_GOAL_MS:.0f} ms: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--harness-queries", type=int, default=5)
    args = parser.parse_args()

    print(machine_summary({"polars": pl.__version__}))
    print(f"load average before: {load_average()}")
    counts = prepare(args.work)
    events = pl.read_parquet(DataLayout(args.work).database_path("events", LAST_MONTH))
    split = queries_from_events(events, LAST_MONTH, min_mentions=100, min_articles=5)
    queries = split.sample(QUERIES, seed=SEED).sort("query_id")
    print(f"history: {counts['events']:,} events over {MONTHS} months; {queries.height:,} of {split.height:,} queries")

    baselines(args.work, queries, args.rounds)
    harness_overhead(args.work, queries.head(args.harness_queries))
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
