"""Ingestion parse benchmark: one generated GDELT day, our parser against pandas.

    .venv/bin/python bench/ingest.py [--data DIR] [--rounds N]

Generates one UTC day with ``pipeline.mirror.generate`` (96 slots; export and mentions zips) or
reuses ``--data``, unzips every file once, then times, in this one process and in alternating
rounds so both sides see the same machine state:

* ours: ``parse_export`` / ``parse_mentions`` on the CSV bytes: split, type every column per
  ``schema.py``, reject malformed lines with their reasons;
* pandas: ``pandas.read_csv(io.BytesIO(csv), sep='\\t', header=None, dtype=str, quoting=3)``, all
  text, no typing. The generated day contains lines with a wrong field count and invalid UTF-8 on
  purpose, on which that exact call raises, so the baseline also gets
  ``on_bad_lines='skip', encoding_errors='replace'``: it drops or mangles those lines silently.

Unzipping is excluded from both timings (it is the same ``open_gdelt_zip`` call either way; its
own time is printed for scale). Rows/s counts input lines for both sides.

Peak RSS is measured twice: ``ru_maxrss`` of this process, which holds the whole unzipped day
and ran both sides; and for each side alone in a fresh subprocess (``--worker``) that goes through
the day one file at a time, as the pipeline does, and imports only its own parser. There the
high-water mark after imports is printed next to the one after parsing (read from ``VmHWM``, see
``own_peak_rss_mib``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import date
from pathlib import Path

from pipeline.gdelt import open_gdelt_zip, parse_export, parse_mentions

DAY = date(2024, 1, 1)
SEED = 0
PANDAS_OPTIONS = {"sep": "\t", "header": None, "dtype": str, "quoting": 3}
# Needed only because the generated day holds malformed lines (see the module docstring).
PANDAS_TOLERANCE = {"on_bad_lines": "skip", "encoding_errors": "replace"}


def day_files(feed: Path) -> list[Path]:
    files = sorted(feed.glob("*.zip"))
    if not files:
        raise SystemExit(f"no zips under {feed}")
    return files


def unzip(path: Path) -> tuple[str, bytes]:
    """(kind, CSV bytes) of one zip of the day."""
    return "export" if ".export." in path.name else "mentions", open_gdelt_zip(path.read_bytes())[1]


def run_ours(day: Iterable[tuple[str, bytes]]) -> dict[str, float]:
    parsers = {"export": parse_export, "mentions": parse_mentions}
    totals = {"seconds": 0.0, "lines": 0, "rows": 0, "rejects": 0}
    for kind, csv in day:
        start = time.perf_counter()
        parsed = parsers[kind](csv)
        totals["seconds"] += time.perf_counter() - start
        totals["lines"] += parsed.total_lines
        totals["rows"] += parsed.rows.height
        totals["rejects"] += parsed.rejects.height
    return totals


def run_pandas(day: Iterable[tuple[str, bytes]]) -> dict[str, float]:
    import pandas as pd  # here, so that the other side's subprocess never loads it

    totals = {"seconds": 0.0, "rows": 0}
    for _, csv in day:
        start = time.perf_counter()
        frame = pd.read_csv(io.BytesIO(csv), **PANDAS_OPTIONS, **PANDAS_TOLERANCE)
        totals["seconds"] += time.perf_counter() - start
        totals["rows"] += len(frame)
    return totals


SIDES = {"ours": run_ours, "pandas": run_pandas}


def peak_rss_mib() -> float:
    """This process's peak RSS, from ``ru_maxrss`` (KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def own_peak_rss_mib() -> float:
    """Peak RSS of this program alone. Linux carries ``ru_maxrss`` across fork and exec, so a
    worker would report its parent's peak; ``VmHWM`` belongs to the address space exec created."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return peak_rss_mib()


def worker(side: str, feed: Path) -> None:
    """Parse the day once with one side in a fresh process, one file in memory at a time; print
    JSON for the parent."""
    if side == "pandas":
        import pandas  # noqa: F401  (counted in the baseline, like polars is for ours)
    before = own_peak_rss_mib()
    result = SIDES[side](unzip(path) for path in day_files(feed))
    print(json.dumps({"peak_before_mib": before, "peak_after_mib": own_peak_rss_mib(), **result}))


def in_subprocess(side: str, feed: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", side, "--data", str(feed)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def machine() -> str:
    import pandas as pd
    import polars as pl

    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")] if cpuinfo.exists() else []
    return (
        f"{models[0] if models else platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
        f"polars {pl.__version__}, pandas {pd.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a mirror directory from generate_mirror (default: generate one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data / "gdeltv2")
        return

    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as scratch:
        mirror = args.data
        if mirror is None:
            from pipeline.mirror.generate import generate_mirror

            mirror = Path(scratch)
            generate_mirror(mirror, DAY, DAY, seed=SEED)
        feed = mirror / "gdeltv2"
        start = time.perf_counter()
        day = [unzip(path) for path in day_files(feed)]
        unzip_s = time.perf_counter() - start
        kinds = {k: sum(1 for kind, _ in day if kind == k) for k in ("export", "mentions")}
        size_mib = sum(len(csv) for _, csv in day) / 2**20
        print(f"machine: {machine()}")
        print(f"data: {DAY} seed {SEED}: {kinds['export']} export + {kinds['mentions']} mentions files, "
              f"{size_mib:.1f} MiB of CSV; unzipping all of it took {unzip_s:.3f} s (excluded below)")

        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        results: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for side, run in SIDES.items():
                results[side] = run(day)
                seconds[side].append(results[side]["seconds"])
        lines = results["ours"]["lines"]
        print(f"lines: {lines:,} ({results['ours']['rows']:,} rows kept, {results['ours']['rejects']:,} rejected; "
              f"pandas returned {results['pandas']['rows']:,} rows)")
        print(f"same process, {args.rounds} alternating rounds (median / best):")
        for side in SIDES:
            med, best = statistics.median(seconds[side]), min(seconds[side])
            print(f"  {side:7s} {med:7.3f} s / {best:7.3f} s   {lines / med:12,.0f} / {lines / best:12,.0f} rows/s")
        ratio_med = statistics.median(seconds["pandas"]) / statistics.median(seconds["ours"])
        ratio_best = min(seconds["pandas"]) / min(seconds["ours"])
        print(f"  ours is {ratio_med:.2f}x faster than pandas (median), {ratio_best:.2f}x (best)")
        print(f"  peak RSS of this process (both sides): {peak_rss_mib():.0f} MiB")

        print("fresh subprocess per side (one pass, one file in memory at a time; peak RSS after imports -> after parsing):")
        for side in SIDES:
            r = in_subprocess(side, mirror)
            print(f"  {side:7s} {r['seconds']:7.3f} s {lines / r['seconds']:12,.0f} rows/s   "
                  f"peak RSS {r['peak_before_mib']:.0f} -> {r['peak_after_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
