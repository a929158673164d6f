"""How long a code-block sandbox takes to start: the first ``run_code`` of a fresh environment
(spawn under its namespaces, imports, the gated tables over the pipe, lockdown, one tiny block),
on a small generated database, so the number is the sandbox's own cost rather than the tables'.
Measured without libraries, then with numpy, then with numpy and pandas loaded for agent code
(``code_libraries``; MIRAI's prompt offers them), interleaved round by round so that load on the
machine falls on every variant alike. Prints p50/p99/min/max per variant, its p50 as a ratio of the
variant without libraries, and the layers the sandbox had. Run as
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
VARIANTS = {"no libraries": (), "numpy": ("numpy",), "numpy + pandas": ("numpy", "pandas")}


def main() -> None:
    samples = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="mirai-sandbox-bench-") as tmp:
        generate_event_database(tmp, date(2023, 11, 1), 2, seed=21, quads_per_day=60)
        databases = {name: EventDatabase(tmp, code_libraries=libs) for name, libs in VARIANTS.items()}
        report = None
        for _ in range(STARTS):
            for name, db in databases.items():
                env = db.environment(date(2023, 12, 15))
                start = time.perf_counter()
                assert env.run_code("1").strip() == "1"
                samples[name].append(time.perf_counter() - start)
                report = env.sandbox_report
                env.close()
    baseline = statistics.median(samples["no libraries"])
    print(f"sandbox start ({STARTS} starts per variant)")
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
