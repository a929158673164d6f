"""LLM evaluation throughput: concurrent episodes against a real OpenAI-compatible server.

    flock /tmp/mirai-bench.lock .venv/bin/python bench/evaluate_llm.py [--episodes N] [--steps S]
        [--latency L] [--concurrency 16 32] [--policy null|calls] [--per-day K] [--months M] [--work DIR]
        [--gate-baseline]

Input. ``testbed.database.generate_event_database`` writes ``--months`` months (default 2, 400
quads a day: a small database) under ``--work``; ``--episodes`` queries are drawn over the last
month's days (one a day round and round, or ``--per-day`` K on each day in turn: episodes of one
cutoff share the cutoff gate) and a fixed list of country pairs. The endpoint is ``testbed.chat`` in its own
process on 127.0.0.1 (so its CPU is not counted as the harness's), answering every request after
``--latency`` seconds with a scripted reply:

* ``--policy null`` (default): mode mirai with empty actions, which run nothing, so no sandbox
  starts; S - 1 turns and the answer extraction make S requests per episode. This isolates the
  harness (threads, HTTP, rate limiter, checkpoint) from the sandbox's start (issue 18's other part).
* ``--policy calls``: native ReAct with a real API call in each of the first S - 1 turns (a
  sandbox per episode, started at its first call), then the final answer: S requests.

Measured per concurrency c (``evaluate_agent`` end to end with an EventDatabase loaded once, as
the evaluation asset holds one for all distances; its run directory and checkpoint cleared first): achieved episodes/s ÷ the ideal c / (S × latency) (goal ≥ 0.8 at c = 16 and 32);
the same ratio for a sequential run (c = 1, on at most 8 episodes) and the speed-up over it; the
harness's CPU per step (this process's CPU time, all threads, ÷ requests; the server's and the
sandboxes' processes are not counted); this process's peak RSS;
and, with ``--policy calls``, the first step's environment time (sandbox start and first call),
p50 and p99. The load average is printed before and after, since the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from common import machine as machine_summary
from common import own_peak_rss_mib
from pipeline.agent_api import EventDatabase, cutoff_gate
from pipeline.agent_api.cutoff_gate import CutoffGate
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.evaluation.episodes import gated_tables_mb, sandbox_slots
from pipeline.evaluation.registry import Agent, Endpoint
from pipeline.evaluation.run import checkpoint_path, evaluate_agent
from pipeline.storage import DataLayout
from testbed.database import generate_event_database

ROOT = Path(__file__).resolve().parents[1]
FIRST_MONTH = date(2024, 1, 1)
PAIRS = [("USA", "CHN"), ("RUS", "UKR"), ("FRA", "DEU"), ("IND", "PAK"), ("ISR", "IRN"), ("GBR", "USA")]
GOAL = 0.8
SEQUENTIAL_EPISODES = 8


def database(work: Path, months: int, quads_per_day: int) -> Path:
    data_dir = work / f"db-{months}m-{quads_per_day}q"
    if not (data_dir / "database").exists():
        generate_event_database(data_dir, FIRST_MONTH, months, seed=0, quads_per_day=quads_per_day)
    return data_dir


def last_month(months: int) -> date:
    year, month = divmod(FIRST_MONTH.month - 1 + months - 1, 12)
    return date(FIRST_MONTH.year + year, month + 1, 1)


def queries(n: int, month: date, per_day: int = 0) -> pl.DataFrame:
    """``n`` queries over the month's first 27 days: ``per_day`` on each day in turn, or (0) one a
    day round and round."""
    days = [i // per_day % 27 if per_day else i % 27 for i in range(n)]
    return pl.DataFrame(
        {
            "query_id": [f"{month:%Y-%m}-{i:05d}" for i in range(1, n + 1)],
            "date": [month + timedelta(days=1 + day) for day in days],
            "s": [PAIRS[i % len(PAIRS)][0] for i in range(n)],
            "o": [PAIRS[i % len(PAIRS)][1] for i in range(n)],
            "answer_dict": [json.dumps({"04": ["042"]})] * n,
        }
    )


def bench_agent(base_url: str, policy: str, steps: int) -> Agent:
    null = policy == "null"
    return Agent(
        name="bench-llm",
        kind="llm",
        knowledge_cutoff=date(2023, 6, 30),
        distances=(1,),
        rounds=1,
        endpoint=Endpoint(base_url, "scripted", None),
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        # null: S - 1 turns and the extraction; calls: S - 1 calls and the final answer.
        max_steps=steps - 1 if null else steps,
        mode="mirai" if null else "native",
    )


def run(
    data_dir: Path, frame: pl.DataFrame, agent: Agent, concurrency: int, database: EventDatabase, memory_mb: int
) -> dict:
    directory = DataLayout(data_dir).evaluation_dir(frame.get_column("date").min().replace(day=1), agent.name, "b", 1)
    shutil.rmtree(directory, ignore_errors=True)
    checkpoint_path(directory).unlink(missing_ok=True)
    cpu = time.process_time()
    started = time.perf_counter()
    results, _ = evaluate_agent(
        frame,
        data_dir,
        agent,
        1,
        query_set="b",
        concurrency=concurrency,
        database=database,
        sandbox_memory_mb=memory_mb,
    )
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (directory / "trajectories.jsonl").read_text().splitlines()]
    requests = sum(len(t["steps"]) for t in lines)
    first_env = [t["steps"][0]["env_s"] for t in lines if t["steps"] and t["steps"][0]["env_s"] > 0]
    return {
        "episodes": results.height,
        "wall_s": wall,
        "requests": requests,
        "cpu_ms_per_step": (time.process_time() - cpu) / requests * 1000,
        "first_env_s": first_env,
        "end_states": dict(results.get_column("end_state").value_counts().iter_rows()),
    }


class _NoLease:
    waited = 0.0

    def release(self) -> None:
        pass


class _EveryEpisodeAtOnce(CutoffGate):
    """The baseline of --gate-baseline: sandboxes of every cutoff exist and run together, as before
    the gate."""

    def lease(self, cutoff: date, handover_grid_s: float | None = None) -> _NoLease:
        return _NoLease()


@contextlib.contextmanager
def ungated() -> Iterator[None]:
    gate, cutoff_gate.CUTOFF_GATE = cutoff_gate.CUTOFF_GATE, _EveryEpisodeAtOnce()
    try:
        yield
    finally:
        cutoff_gate.CUTOFF_GATE = gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--policy", choices=("null", "calls"), default="null")
    parser.add_argument(
        "--per-day",
        type=int,
        default=0,
        help="queries on each day in turn (MIRAI's test split: 705 over 30 days, about 23); 0: one a day, round and round",
    )
    parser.add_argument("--months", type=int, default=2)
    parser.add_argument("--quads-per-day", type=int, default=400)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mirai-bench-evaluate-llm"))
    parser.add_argument(
        "--sandbox-memory-mb",
        type=int,
        default=DEFAULT_MEMORY_MB,
        help="each code sandbox's memory limit (LlmRuntime.sandbox_memory_mb); with the machine's memory it "
        "bounds the live sandboxes",
    )
    parser.add_argument(
        "--gate-baseline",
        action="store_true",
        help="also run each concurrency with every sandbox let through at once (no cutoff gate) and print the ratio",
    )
    args = parser.parse_args()
    print(machine_summary({"polars": pl.__version__}))
    print(f"load average before: {os.getloadavg()}")
    data_dir = database(args.work, args.months, args.quads_per_day)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "testbed.chat", "--policy", args.policy, "--steps", str(args.steps)]
    server = subprocess.Popen(
        [*command, "--latency", str(args.latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        base_url = server.stdout.readline().strip()
        agent = bench_agent(base_url, args.policy, args.steps)
        month = last_month(args.months)
        print(
            f"database: {args.months} month(s), {args.quads_per_day} quads/day; policy {args.policy}; "
            f"S = {args.steps} requests/episode; latency {args.latency} s; endpoint {base_url} (own process); "
            f"sandbox memory limit {args.sandbox_memory_mb} MB"
        )
        per_episode = args.steps * args.latency
        # Loaded once, as the evaluation asset does for all of an agent's distances; the
        # sequential run (first) loads its months.
        db = EventDatabase(data_dir)
        memory = args.sandbox_memory_mb
        sequential = run(data_dir, queries(min(SEQUENTIAL_EPISODES, args.episodes), month), agent, 1, db, memory)
        base_rate = sequential["episodes"] / sequential["wall_s"]
        rows = [(1, sequential)]
        for c in args.concurrency:
            if args.policy == "calls":
                tables_mb = gated_tables_mb(db, queries(args.episodes, month, args.per_day), 1)
                print(f"c = {c}: at most {sandbox_slots(c, tables_mb, memory).n} live sandboxes and as many spares")
            if args.gate_baseline:
                with ungated():
                    baseline = run(data_dir, queries(args.episodes, month, args.per_day), agent, c, db, memory)
            rows.append((c, run(data_dir, queries(args.episodes, month, args.per_day), agent, c, db, memory)))
            if args.gate_baseline:
                print(
                    f"c = {c}: wall {rows[-1][1]['wall_s']:.2f} s under the cutoff gate, {baseline['wall_s']:.2f} s "
                    f"without it: {baseline['wall_s'] / rows[-1][1]['wall_s']:.2f} of the ungated throughput"
                )
        print(
            f"{'c':>3} {'episodes':>8} {'wall s':>7} {'eps/s':>7} {'ideal':>7} {'ratio':>6} {'vs c=1':>7} "
            f"{'CPU ms/step':>11} {'first env p50/p99 s':>19}  end states"
        )
        for c, r in rows:
            rate = r["episodes"] / r["wall_s"]
            ideal = c / per_episode
            first = r["first_env_s"]
            env_cell = (
                f"{statistics.median(first):.3f}/{sorted(first)[max(0, round(0.99 * len(first)) - 1)]:.3f}"
                if first
                else "no sandbox"
            )
            goal = "" if c < 16 else ("  (goal met)" if rate / ideal >= GOAL else "  (GOAL MISSED)")
            print(
                f"{c:>3} {r['episodes']:>8} {r['wall_s']:>7.2f} {rate:>7.2f} {ideal:>7.2f} {rate / ideal:>6.2f} "
                f"{rate / base_rate:>6.1f}x {r['cpu_ms_per_step']:>11.2f} "
                f"{env_cell:>19}  {r['end_states']}{goal}"
            )
        print(f"peak RSS of this process: {own_peak_rss_mib():.0f} MiB")
    finally:
        server.stdin.close()
        print(f"server: requests, most in flight: {server.stdout.read().strip()}")
        server.wait(timeout=30)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
