"""The three day suites (quality/suites.py: raw_events, events, daily_quads), this code against
the suites of an earlier commit, in one process.

    .venv/bin/python bench/day_suites.py [--scale 0.05] [--slots 96] [--rounds 7] [--baseline REV]

Input: one generated UTC day (``testbed.generate``, seed 0, ``event_scale=--scale``;
``--slots`` of its 96 slots, as a day looks part way through), every export zip parsed with
``parse_export``, then ``normalize_events`` and ``daily_quads``: the frames the three asset checks
read. Each 15-minute tick validates the whole day so far with all three suites.

The baseline is ``quality/suites.py`` as of ``--baseline`` (default: the commit before the suites
combined their row rules and cached their GX context), read with ``git show`` and loaded as a
separate module; it imports the same pipeline code. Rounds alternate baseline / current after one
warm-up call each (the first call pays ``import great_expectations`` and, now, building the
suites). Both must agree on pass/fail. Printed: median and best seconds per suite and for the
three together, and the ratio baseline / current.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl

from common import machine

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "72660f9"  # quality/suites.py before the row rules were combined (docs/benchmarks.md)


def load_baseline(rev: str):
    source = subprocess.run(
        ["git", "show", f"{rev}:quality/suites.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "suites_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("suites_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def day_frames(scale: float, slots: int) -> tuple[dict[datetime, pl.DataFrame], pl.DataFrame, pl.DataFrame]:
    from pipeline.events.normalize import normalize_events
    from pipeline.events.quads import daily_quads
    from pipeline.gdelt.parse import parse_export
    from testbed.generate import MirrorOptions, generate_mirror

    day = date(2024, 1, 1)
    with tempfile.TemporaryDirectory() as tmp:
        generate_mirror(Path(tmp), day, day, seed=0, options=MirrorOptions(event_scale=scale))
        zips = sorted(Path(tmp).glob("**/*.export.CSV.zip"))[:slots]
        raw = {
            datetime.strptime(z.name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC): parse_export(
                z.read_bytes(), source=z.name
            ).rows
            for z in zips
        }
    events = normalize_events(pl.concat(list(raw.values())))
    events = events.filter(pl.col("date") == day)  # the day's partition
    return raw, events, daily_quads(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale", type=float, default=0.05, help="event_scale of the generated day (the soak uses 0.05)"
    )
    parser.add_argument("--slots", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args()

    import great_expectations

    from quality import suites as current

    baseline = load_baseline(args.baseline)
    raw, events, quads = day_frames(args.scale, args.slots)
    print(machine({"polars": pl.__version__, "great_expectations": great_expectations.__version__}))
    print(
        f"day: {len(raw)} slots, {sum(f.height for f in raw.values())} export rows, "
        f"{events.height} events, {quads.height} quads; baseline {args.baseline}"
    )
    calls = {
        "raw_events": lambda m: m.validate_raw_events(raw),
        "events": lambda m: m.validate_events(events),
        "daily_quads": lambda m: m.validate_daily_quads(quads),
    }
    times: dict[tuple[str, str], list[float]] = {(s, w): [] for s in calls for w in ("baseline", "current")}
    for name, call in calls.items():  # warm-up: imports, reference tables, suite building
        for which, module in (("baseline", baseline), ("current", current)):
            res = call(module)
            assert res.passed, (which, name, res.failures)
    for _ in range(args.rounds):
        for name, call in calls.items():
            for which, module in (("baseline", baseline), ("current", current)):
                started = time.perf_counter()
                call(module)
                times[(name, which)].append(time.perf_counter() - started)
    totals = {w: [sum(times[(s, w)][i] for s in calls) for i in range(args.rounds)] for w in ("baseline", "current")}
    print(f"{'suite':<12} {'baseline med/best s':>22} {'current med/best s':>22} {'ratio (median)':>15}")
    for name in [*calls, "all three"]:
        b = totals["baseline"] if name == "all three" else times[(name, "baseline")]
        c = totals["current"] if name == "all three" else times[(name, "current")]
        print(
            f"{name:<12} {statistics.median(b):>13.3f} / {min(b):.3f} {statistics.median(c):>13.3f} / {min(c):.3f} "
            f"{statistics.median(b) / statistics.median(c):>14.1f}x"
        )


if __name__ == "__main__":
    main()
