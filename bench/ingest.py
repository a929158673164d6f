"""Ingestion parse benchmark: one generated GDELT day, our parser against pandas.

    .venv/bin/python bench/ingest.py [--data DIR] [--rounds N] [--workers N]

Generates one UTC day with ``testbed.generate`` (96 slots; export and mentions zips) or
reuses ``--data``, unzips every file once, then times, in this one process and in alternating
rounds so all sides see the same machine state:

* ours: ``parse_files(items, kind)``, exactly as ``parse_day`` runs it for a day (batches of
  files per ``pl.read_csv``, ``--workers`` threads, default one per core): split, type every
  column per ``schema.py``, reject malformed lines with their reasons;
* ours, 1 thread: the same call with ``workers=1``;
* ours, file by file: ``parse_export`` / ``parse_mentions`` called once per file (what a caller
  of the single-file API gets);
* pandas: ``pandas.read_csv(io.BytesIO(csv), sep='\\t', header=None, dtype=str, quoting=3)``
  once per file, all text, no typing. The generated day contains lines with a wrong field count
  and invalid UTF-8 on purpose, on which that exact call raises, so the baseline also gets
  ``on_bad_lines='skip', encoding_errors='replace'``: it drops or mangles those lines silently.

Unzipping is excluded from these timings (it is the same ``open_gdelt_zip`` call either way; its
own time is printed for scale). Rows/s counts input lines for every side.

Peak RSS is measured twice: ``ru_maxrss`` of this process, which holds the whole unzipped day
and ran every side; and for ours and pandas alone in a fresh subprocess (``--worker``) that goes
through the day from the zip files as the pipeline does: ours hands the zip bytes to
``parse_files`` (which unzips in its threads and holds a few batches of files at a time), pandas
unzips and reads one file at a time. Those runs include the unzipping on both sides. There the
high-water mark after imports is printed next to the one after parsing (read from ``VmHWM``, see
``own_peak_rss_mib``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path

from common import machine as machine_summary
from common import own_peak_rss_mib
from pipeline.gdelt import open_gdelt_zip, parse_export, parse_mentions
from pipeline.gdelt.parse import default_workers, parse_files

DAY = date(2024, 1, 1)
SEED = 0
KINDS = ("export", "mentions")
PANDAS_OPTIONS = {"sep": "\t", "header": None, "dtype": str, "quoting": 3}
# Needed only because the generated day holds malformed lines (see the module docstring).
PANDAS_TOLERANCE = {"on_bad_lines": "skip", "encoding_errors": "replace"}

# One file of the day: (kind, bytes, name). The bytes are the CSV, or the zip when the name ends
# in .zip (the parser then unzips, as parse_day has it do).
File = tuple[str, bytes, str]


def day_files(feed: Path) -> list[Path]:
    files = sorted(feed.glob("*.zip"))
    if not files:
        raise SystemExit(f"no zips under {feed}")
    return files


def kind_of(path: Path) -> str:
    return "export" if ".export." in path.name else "mentions"


def unzip(path: Path) -> File:
    """(kind, CSV bytes, CSV name) of one zip of the day."""
    name, csv = open_gdelt_zip(path.read_bytes())
    return kind_of(path), csv, name


def run_ours(day: Callable[[], Iterable[File]], workers: int) -> dict[str, float]:
    """Parse the day the way parse_day does: one ``parse_files`` call per kind."""
    totals = {"seconds": 0.0, "lines": 0, "rows": 0, "rejects": 0}
    start = time.perf_counter()
    for kind in KINDS:
        items = ((data, name) for k, data, name in day() if k == kind)
        for parsed in parse_files(items, kind, workers=workers):
            totals["lines"] += parsed.total_lines
            totals["rows"] += parsed.rows.height
            totals["rejects"] += parsed.rejects.height
    totals["seconds"] = time.perf_counter() - start
    return totals


def run_ours_file_by_file(day: Callable[[], Iterable[File]]) -> dict[str, float]:
    parsers = {"export": parse_export, "mentions": parse_mentions}
    totals = {"seconds": 0.0, "lines": 0, "rows": 0, "rejects": 0}
    for kind, data, name in day():
        start = time.perf_counter()
        parsed = parsers[kind](data, name)
        totals["seconds"] += time.perf_counter() - start
        totals["lines"] += parsed.total_lines
        totals["rows"] += parsed.rows.height
        totals["rejects"] += parsed.rejects.height
    return totals


def run_pandas(day: Callable[[], Iterable[File]]) -> dict[str, float]:
    import pandas as pd  # here, so that the other side's subprocess never loads it

    totals = {"seconds": 0.0, "rows": 0}
    for _, data, name in day():
        start = time.perf_counter()
        csv = open_gdelt_zip(data)[1] if name.endswith(".zip") else data
        frame = pd.read_csv(io.BytesIO(csv), **PANDAS_OPTIONS, **PANDAS_TOLERANCE)
        totals["seconds"] += time.perf_counter() - start
        totals["rows"] += len(frame)
    return totals


def worker(side: str, feed: Path, workers: int) -> None:
    """Parse the day once with one side in a fresh process, straight from the zip files, reading
    each when its turn comes; print JSON for the parent."""
    if side == "pandas":
        import pandas  # noqa: F401  (counted in the baseline, like polars is for ours)
    before = own_peak_rss_mib()
    files = day_files(feed)

    def day() -> Iterable[File]:
        return ((kind_of(path), path.read_bytes(), path.name) for path in files)

    result = run_ours(day, workers) if side == "ours" else run_pandas(day)
    print(json.dumps({"peak_before_mib": before, "peak_after_mib": own_peak_rss_mib(), **result}))


def in_subprocess(side: str, feed: Path, workers: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", side, "--data", str(feed), "--workers", str(workers)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def machine() -> str:
    import pandas as pd
    import polars as pl

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return machine_summary(
        {"polars": f"{pl.__version__} ({pl.thread_pool_size()} threads)", "pandas": pd.__version__}
    ) + (f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a mirror directory from generate_mirror (default: generate one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="parse_files threads (default: one per core)"
    )
    parser.add_argument("--worker", choices=("ours", "pandas"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data / "gdeltv2", args.workers)
        return

    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as scratch:
        mirror = args.data
        if mirror is None:
            from testbed.generate import generate_mirror

            mirror = Path(scratch)
            generate_mirror(mirror, DAY, DAY, seed=SEED)
        feed = mirror / "gdeltv2"
        start = time.perf_counter()
        unzipped = [unzip(path) for path in day_files(feed)]
        unzip_s = time.perf_counter() - start
        kinds = {k: sum(1 for kind, _, _ in unzipped if kind == k) for k in KINDS}
        size_mib = sum(len(csv) for _, csv, _ in unzipped) / 2**20
        print(f"machine: {machine()}")
        print(
            f"data: {DAY} seed {SEED}: {kinds['export']} export + {kinds['mentions']} mentions files, "
            f"{size_mib:.1f} MiB of CSV; unzipping all of it took {unzip_s:.3f} s (excluded below)"
        )

        def day() -> list[File]:
            return unzipped

        sides: dict[str, Callable[[], dict[str, float]]] = {
            f"ours ({args.workers} threads)": lambda: run_ours(day, args.workers),
            "ours (1 thread)": lambda: run_ours(day, 1),
            "ours (file by file)": lambda: run_ours_file_by_file(day),
            "pandas": lambda: run_pandas(day),
        }
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        results: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for side, run in sides.items():
                results[side] = run()
                seconds[side].append(results[side]["seconds"])
        ours = next(iter(sides))
        lines = results[ours]["lines"]
        for side in sides:
            if side != "pandas" and (results[side]["rows"], results[side]["rejects"]) != (
                results[ours]["rows"],
                results[ours]["rejects"],
            ):
                raise SystemExit(f"{side} disagrees with {ours}: {results[side]} vs {results[ours]}")
        print(
            f"lines: {lines:,} ({results[ours]['rows']:,} rows kept, {results[ours]['rejects']:,} rejected; "
            f"pandas returned {results['pandas']['rows']:,} rows)"
        )
        print(f"same process, {args.rounds} alternating rounds (median / best):")
        pandas_med, pandas_best = statistics.median(seconds["pandas"]), min(seconds["pandas"])
        for side in sides:
            med, best = statistics.median(seconds[side]), min(seconds[side])
            ratio = "" if side == "pandas" else f"   {pandas_med / med:5.2f}x / {pandas_best / best:5.2f}x pandas"
            print(
                f"  {side:22s} {med:7.3f} s / {best:7.3f} s   {lines / med:12,.0f} / {lines / best:12,.0f} rows/s{ratio}"
            )
        print(f"  peak RSS of this process (every side): {own_peak_rss_mib():.0f} MiB")

        print(
            "fresh subprocess per side, from the zip files, unzipping included "
            "(one pass; peak RSS after imports -> after parsing):"
        )
        for side in ("ours", "pandas"):
            r = in_subprocess(side, mirror, args.workers)
            label = f"ours ({args.workers} threads)" if side == "ours" else side
            print(
                f"  {label:22s} {r['seconds']:7.3f} s {lines / r['seconds']:12,.0f} rows/s   "
                f"peak RSS {r['peak_before_mib']:.0f} -> {r['peak_after_mib']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
