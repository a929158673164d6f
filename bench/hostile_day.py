"""Hostile GDELT day: peak memory of ``ingest_day`` and ``parse_day`` when eight export files with
correct md5s each inflate to just under the zip cap, against the same day with its normal files.

    .venv/bin/python bench/hostile_day.py [--cap-mb N] [--limit-mib N]

Generates one UTC day (``testbed.generate``), copies it twice: a baseline mirror as
generated, and a hostile one where eight export slots are replaced by the shapes of
``testbed/hostile.py`` (huge lines, the most rows / rejects / lines per byte, 60 columns,
oversized real rows), each relisted with its true md5. Each mirror is served over HTTP on
127.0.0.1 (``MirrorServer``), and for each, in fresh subprocesses: ``ingest_day`` (download and
verify every file), then ``parse_day`` for the exports. The default cap is the pipeline's own
(``MIRAI_MAX_UNCOMPRESSED_MB``, 32 MiB). Printed per side: the subprocess's peak RSS (``VmHWM``,
see ``bench/common.py``) after imports and after the call, the wall time, what the day came to
(rows, rejects, quarantined slots), and the hostile/baseline ratio of the peaks. Exits non-zero
when the hostile ``parse_day`` peaks above ``--limit-mib`` (1536: the bound docs/data-layout.md
states).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, own_peak_rss_mib
from pipeline.config import DEFAULT_MAX_UNCOMPRESSED_MB, DatasetSettings, GdeltSettings, Settings

DAY = date(2024, 1, 1)
# Spread over the day, away from the generator's outage and catch-up slots.
SLOTS = [datetime(2024, 1, 1, hour, 15, tzinfo=UTC) for hour in (1, 4, 7, 10, 13, 16, 19, 22)]


def worker(step: str, data_dir: Path, base_url: str, cap_mb: int) -> None:
    """One step in this fresh process; print JSON for the parent."""
    from pipeline.gdelt.ingest import ingest_day, parse_day

    settings = Settings(
        dataset=DatasetSettings(data_dir=data_dir),
        gdelt=GdeltSettings(base_url=base_url, max_uncompressed_mb=cap_mb, backoff_base_s=0.01, backoff_max_s=0.05),
    )
    before = own_peak_rss_mib()
    started = time.perf_counter()
    if step == "ingest":
        result = ingest_day(DAY, settings.dataset, settings.network, settings.gdelt)
        outcome = {k: v for k, v in result.counts.items() if v}
    else:
        parsed = parse_day(DAY, "export", settings.dataset, settings.gdelt)
        outcome = {
            "rows": parsed.rows,
            "rejects": parsed.rejects,
            "parsed": parsed.parsed,
            "quarantined": len(parsed.refused),
        }
    print(
        json.dumps(
            {
                "before_mib": before,
                "peak_mib": own_peak_rss_mib(),
                "seconds": time.perf_counter() - started,
                "outcome": outcome,
            }
        )
    )


def in_subprocess(step: str, data_dir: Path, base_url: str, cap_mb: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            step,
            "--data",
            str(data_dir),
            "--base-url",
            base_url,
            "--cap-mb",
            str(cap_mb),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def run_side(mirror_dir: Path, data_dir: Path, cap_mb: int) -> dict[str, dict]:
    from testbed.serve import MirrorServer

    with MirrorServer(mirror_dir) as server:
        return {step: in_subprocess(step, data_dir, server.base_url, cap_mb) for step in ("ingest", "parse")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap-mb", type=int, default=DEFAULT_MAX_UNCOMPRESSED_MB)
    parser.add_argument("--limit-mib", type=float, default=1536.0)
    parser.add_argument("--worker", choices=("ingest", "parse"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.base_url, args.cap_mb)
        return 0

    import polars as pl

    from testbed.generate import generate_mirror
    from testbed.hostile import SHAPES, plant_hostile_day

    print(machine({"polars": pl.__version__}))
    with tempfile.TemporaryDirectory(prefix="mirai-hostile-") as tmp:
        root = Path(tmp)
        generate_mirror(root / "baseline", DAY, DAY, seed=7)
        shutil.copytree(root / "baseline", root / "hostile")
        started = time.perf_counter()
        plant_hostile_day(root / "hostile", SLOTS, args.cap_mb * 2**20)
        zips = [(root / "hostile" / "gdeltv2" / f"{slot:%Y%m%d%H%M%S}.export.CSV.zip").stat().st_size for slot in SLOTS]
        print(
            f"eight hostile exports ({', '.join(SHAPES)}): each inflates to {args.cap_mb} MiB - 64 bytes, "
            f"zipped {min(zips):,}-{max(zips):,} bytes; built in {time.perf_counter() - started:.1f} s"
        )
        sides = {side: run_side(root / side, root / f"data-{side}", args.cap_mb) for side in ("baseline", "hostile")}
    for step in ("ingest", "parse"):
        base, hostile = sides["baseline"][step], sides["hostile"][step]
        for side, result in (("baseline", base), ("hostile", hostile)):
            print(
                f"{step:6} {side:8}: peak RSS {result['peak_mib']:7.0f} MiB (after imports {result['before_mib']:.0f}), "
                f"{result['seconds']:6.2f} s, {result['outcome']}"
            )
        print(f"{step:6} hostile/baseline peak RSS: {hostile['peak_mib'] / base['peak_mib']:.2f}x")
    peak = sides["hostile"]["parse"]["peak_mib"]
    verdict = "under" if peak <= args.limit_mib else "OVER"
    print(f"hostile parse_day peak {peak:.0f} MiB: {verdict} the {args.limit_mib:.0f} MiB bound")
    return 0 if peak <= args.limit_mib else 1


if __name__ == "__main__":
    sys.exit(main())
