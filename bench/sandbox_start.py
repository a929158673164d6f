"""How long a code-block sandbox takes to start: the first ``run_code`` of a fresh environment
(spawn under its namespaces, imports, the gated tables over the pipe, lockdown, one tiny block),
on a small generated database, so the number is the sandbox's own cost rather than the tables'.
Prints p50/min/max and the layers the sandbox had. Run as
``flock /tmp/mirai-bench.lock .venv/bin/python bench/sandbox_start.py`` (a lock shared with the
other benchmarks, so two never compete for the CPU).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import date

import polars as pl

from common import machine
from pipeline.agent_api import EventDatabase
from pipeline.agent_api.sandbox import layers
from testbed.database import generate_event_database

STARTS = 20


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mirai-sandbox-bench-") as tmp:
        generate_event_database(tmp, date(2023, 11, 1), 2, seed=21, quads_per_day=60)
        db = EventDatabase(tmp)
        samples, report = [], None
        for _ in range(STARTS):
            env = db.environment(date(2023, 12, 15))
            start = time.perf_counter()
            assert env.run_code("1").strip() == "1"
            samples.append(time.perf_counter() - start)
            report = env.sandbox_report
            env.close()
    print(
        f"sandbox start ({STARTS} starts): p50 {statistics.median(samples):.3f} s   min {min(samples):.3f} s   "
        f"max {max(samples):.3f} s"
    )
    for name, value in layers(report).items():
        print(f"  {name}: {value}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine({"polars": pl.__version__}))


if __name__ == "__main__":
    main()
