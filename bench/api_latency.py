"""Latency of the agent API's two busiest calls on a 14-month generated database.

``get_events`` and ``get_relation_distribution`` are what agents call first and most (MIRAI,
arXiv:2407.01231, §4, Figure 8); each call is timed with the filters agents typically pass: a date
range of the last 30 or 90 days and one or two countries from the head (USA, CHN) or the tail of
the popularity curve.
Goal: p99 ≤ 50 ms per call. Run as
``flock /tmp/mirai-bench.lock .venv/bin/python bench/api_latency.py`` (a lock shared with the other
benchmarks, so two never compete for the CPU).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from common import machine
from pipeline.agent_api import DateRange, EventDatabase
from testbed.database import DEFAULT_QUADS_PER_DAY, generate_event_database

GOAL_P99_MS = 50.0
FIRST_MONTH = date(2023, 1, 1)
MONTHS = 14
# Countries at the head and in the tail of the generator's popularity curve.
PAIRS = (
    (["USA"], ["CHN"]),
    (["CHN"], None),
    (None, ["RUS"]),
    (["AUS"], ["CHN"]),
    (["MMR"], None),
    (["NPL"], ["IND"]),
    (["USA", "GBR"], ["UKR", "RUS"]),
)
WINDOWS = (30, 90)


def _percentiles(samples_ms: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49], 2),
        "p99_ms": round(cuts[98], 2),
        "max_ms": round(max(samples_ms), 2),
        "calls": len(samples_ms),
    }


def measure_api_latency(data_dir: Path | str, query_dates: list[date], *, rounds: int) -> dict:
    """p50/p99 per function over ``rounds`` passes of every (window, countries) filter for every
    query date, plus the time to open an environment from a warm EventDatabase."""
    db = EventDatabase(data_dir)
    db.environment(max(query_dates))  # load the months once: the steady state of a split's run
    timings: dict[str, list[float]] = {"get_events": [], "get_relation_distribution": [], "open_environment": []}
    for query_date in query_dates:
        start = time.perf_counter()
        env = db.environment(query_date)
        timings["open_environment"].append((time.perf_counter() - start) * 1000)
        for _ in range(rounds):
            for days in WINDOWS:
                window = DateRange(str(env.cutoff - timedelta(days=days - 1)), str(env.cutoff))
                for heads, tails in PAIRS:
                    for name, function in (
                        ("get_events", env.get_events),
                        ("get_relation_distribution", env.get_relation_distribution),
                    ):
                        start = time.perf_counter()
                        function(window, heads, tails)
                        timings[name].append((time.perf_counter() - start) * 1000)
    return {name: _percentiles(samples) for name, samples in timings.items()}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mirai-api-bench-") as tmp:
        start = time.perf_counter()
        counts = generate_event_database(tmp, FIRST_MONTH, MONTHS, seed=11)
        print(
            f"generated {MONTHS} months ({DEFAULT_QUADS_PER_DAY} quads/day target): {counts['events']:,} events, "
            f"{counts['news']:,} articles in {time.perf_counter() - start:.1f} s"
        )
        query_dates = [date(2024, 2, 1) + timedelta(days=3 * i) for i in range(9)]
        result = measure_api_latency(tmp, query_dates, rounds=5)
    for name, stats in result.items():
        print(
            f"{name:28s} p50 {stats['p50_ms']:7.2f} ms   p99 {stats['p99_ms']:7.2f} ms   "
            f"max {stats['max_ms']:7.2f} ms   ({stats['calls']} calls)"
        )
    worst = max(result["get_events"]["p99_ms"], result["get_relation_distribution"]["p99_ms"])
    print(f"goal p99 <= {GOAL_P99_MS:.0f} ms: {'met' if worst <= GOAL_P99_MS else 'MISSED'} (worst p99 {worst:.2f} ms)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine({"polars": pl.__version__}))


if __name__ == "__main__":
    main()
