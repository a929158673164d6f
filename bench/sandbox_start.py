"""How long a code-block sandbox takes to start: the first ``run_code`` of a fresh environment
(a warm spare taking its tables, lockdown, one tiny block; the spawn and imports when no spare is ready),
on a small generated database, so the number is the sandbox's own cost rather than the tables'.
Measured without libraries, then with numpy, then with numpy and pandas loaded for agent code
(``code_libraries``; MIRAI's prompt offers them), interleaved round by round so that load on the
machine falls on every variant alike. Prints p50/p99/min/max per variant, its p50 as a ratio of the
variant without libraries, and the layers the sandbox had. Each start comes ``--think`` seconds
after its environment opened (below); the three variants keep a warm spare each. Run as
``flock /tmp/mirai-bench.lock .venv/bin/python bench/sandbox_start.py`` (a lock shared with the
other benchmarks, so two never compete for the CPU).

``--history`` measures instead an episode's first ``run_code`` over 14 months of history (the
database bench/evaluate.py generates, about 2.1 M events and 2.8 M articles, under ``--work``):
*cold*, the first episode of each of ``--cutoffs`` new cutoffs, which includes writing that
cutoff's table files (the months are loaded into memory first, so parquet reading is not counted);
*warm*, ``--starts`` further episodes over those cutoffs, whose files exist. Between opening an
episode's environment and its first ``run_code`` the bench waits ``--think`` seconds (default 2):
a ReAct episode's first code block comes after at least one model reply, ~2 s from the endpoint
issue 18 sizes for, and in that time the warm spare the previous episode's start launched
(pipeline/agent_api/sandbox_spares.py, SparePool) finishes its imports; ``--think 0`` measures starts back
to back, where the spare is still importing when it is taken. ``--old-tree DIR``
(a checkout of an earlier commit) also runs the same measurement in a subprocess importing that
tree's ``pipeline``, and prints the ratio of the p50s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from common import machine
from pipeline.agent_api import EventDatabase
from pipeline.agent_api.sandbox import layers
from testbed.database import generate_event_database

STARTS = 20
VARIANTS = {"no libraries": (), "numpy": ("numpy",), "numpy + pandas": ("numpy", "pandas")}


def _p50_p99(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), statistics.quantiles(values, n=100, method="inclusive")[98]


def history_starts(work: Path, cutoffs: int, starts: int, think: float) -> dict:
    """{"cold": [...], "warm": [...]}: seconds to the first run_code's answer, over 14 months,
    ``think`` seconds after the environment opened."""
    db = EventDatabase(work)
    db.gated_tables(db.last_day)  # every month in memory: a cold start then costs writing files, not parquet
    query_days = [db.last_day - timedelta(days=k) for k in range(cutoffs)]
    samples = {"cold": [], "warm": []}
    for i in range(cutoffs + starts):
        env = db.environment(query_days[i % cutoffs])
        time.sleep(think)
        start = time.perf_counter()
        assert env.run_code("print(count_events() > 0)").strip() == "True"
        samples["cold" if i < cutoffs else "warm"].append(time.perf_counter() - start)
        env.close()
    return samples


def history(work: Path, cutoffs: int, starts: int, think: float, old_tree: Path | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from evaluate import prepare

    counts = prepare(work)
    print(f"episode sandbox start over {counts['events']:,} events, {counts['news']:,} articles (14 months)")
    print(f"{think:g} s between opening an episode's environment and its first code block")
    print(f"load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs = {"new": history_starts(work, cutoffs, starts, think)}
    if old_tree is not None:
        out = subprocess.run(
            [sys.executable, __file__, "--measure", str(work), str(cutoffs), str(starts), str(think)],
            env={**os.environ, "PYTHONPATH": f"{old_tree}:{Path(__file__).resolve().parent}"},
            capture_output=True,
            text=True,
            check=True,
        )
        runs["old"] = json.loads(out.stdout.splitlines()[-1])
    for name, samples in runs.items():
        for kind, values in samples.items():
            p50, p99 = _p50_p99(values) if len(values) > 1 else (values[0], values[0])
            print(
                f"  {name:3} {kind:4} n={len(values):2}  p50 {p50:.3f} s   p99 {p99:.3f} s   "
                f"min {min(values):.3f} s   max {max(values):.3f} s"
            )
    if "old" in runs:
        for kind in ("cold", "warm"):
            ratio = statistics.median(runs["old"][kind]) / statistics.median(runs["new"][kind])
            print(f"  {kind} p50 old / new: {ratio:.1f}x")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine({"polars": pl.__version__}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", action="store_true", help="episode starts over 14 months of history")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mirai-bench-evaluate"))
    parser.add_argument("--cutoffs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--think", type=float, default=2.0, help="seconds before an episode's first code block")
    parser.add_argument("--old-tree", type=Path, help="also measure this checkout's pipeline (old path)")
    parser.add_argument("--measure", nargs=4, metavar=("WORK", "CUTOFFS", "STARTS", "THINK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        work, cutoffs, starts, think = args.measure
        print(json.dumps(history_starts(Path(work), int(cutoffs), int(starts), float(think))))
    elif args.history:
        history(args.work, args.cutoffs, args.starts, args.think, args.old_tree)
    else:
        small(args.think)


def small(think: float) -> None:
    samples = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="mirai-sandbox-bench-") as tmp:
        generate_event_database(tmp, date(2023, 11, 1), 2, seed=21, quads_per_day=60)
        databases = {name: EventDatabase(tmp, code_libraries=libs) for name, libs in VARIANTS.items()}
        report = None
        for _ in range(STARTS):
            for name, db in databases.items():
                env = db.environment(date(2023, 12, 15))
                time.sleep(think)
                start = time.perf_counter()
                assert env.run_code("1").strip() == "1"
                samples[name].append(time.perf_counter() - start)
                report = env.sandbox_report
                env.close()
    baseline = statistics.median(samples["no libraries"])
    print(f"sandbox start ({STARTS} starts per variant, {think:g} s after opening the environment)")
    for name, values in samples.items():
        p50, p99 = statistics.median(values), statistics.quantiles(values, n=100, method="inclusive")[98]
        print(
            f"  {name:15} p50 {p50:.3f} s   p99 {p99:.3f} s   min {min(values):.3f} s   max {max(values):.3f} s"
            f"   p50 ratio {p50 / baseline:.2f}"
        )
    print(f"layers ({report['libraries']}):")
    for name, value in layers(report).items():
        print(f"  {name}: {value}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine({"polars": pl.__version__}))


if __name__ == "__main__":
    main()
