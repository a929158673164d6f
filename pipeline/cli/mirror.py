"""`mirai mirror generate`, `mirror serve` and `demo`: the generated GDELT mirror and the whole
chain on it. Their code is testbed/'s, loaded by testbed_module when the command runs (not at import):
testbed/ ships with the source checkout only, and every other command works without it."""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

from pipeline.cli.common import (
    CommandError,
    check_ordered,
    count_arg,
    day_arg,
    month_arg,
    port_arg,
    share_arg,
    testbed_module,
)
from pipeline.config import Settings

DEMO_MONTH = date(2024, 1, 1)


def cmd_mirror_generate(args: argparse.Namespace) -> int:
    generate = testbed_module("generate")
    generate_mirror, MirrorOptions = generate.generate_mirror, generate.MirrorOptions

    check_ordered(args.start, args.end, "--start", "--end")
    started = time.perf_counter()
    # --scale 1 gives the default options, so a default mirror keeps its bytes (and its manifest).
    options = MirrorOptions(event_scale=args.scale)
    manifest = generate_mirror(Path(args.out), args.start, args.end, seed=args.seed, slots=args.slots, options=options)
    print(json.dumps(manifest.get("totals", {}), indent=2))
    print(f"mirror written to {args.out} in {time.perf_counter() - started:.1f}s")
    return 0


def cmd_mirror_serve(args: argparse.Namespace) -> int:
    MirrorServer = testbed_module("serve").MirrorServer

    if not args.dir.is_dir():
        raise CommandError(f"no mirror directory at {args.dir} (`mirai mirror generate --out DIR` writes one)")
    server = MirrorServer(Path(args.dir), port=args.port, latency_s=args.latency_ms / 1000.0, faults_file=args.faults)
    print(f"serving {args.dir} at {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def add_mirror(sub, debug: argparse.ArgumentParser) -> None:
    mirror = sub.add_parser(
        "mirror", parents=[debug], help="a generated GDELT mirror for demos and tests"
    ).add_subparsers(dest="mirror_command", required=True)
    p = mirror.add_parser("generate", parents=[debug], help="write deterministic GDELT-format sample data")
    p.add_argument("--start", type=day_arg, required=True)
    p.add_argument("--end", type=day_arg, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slots", type=count_arg(1), help="only the first N 15-minute slots (fast partial mirrors)")
    p.add_argument(
        "--scale",
        type=share_arg,
        default=1.0,
        help="share of GDELT's events per 15-minute slot, in (0, 1] (default 1: GDELT's volume; a smaller "
        "share makes a smaller mirror that later steps get through faster, as `mirai demo --scale`)",
    )
    p.set_defaults(func=cmd_mirror_generate)
    p = mirror.add_parser("serve", parents=[debug], help="serve a mirror over HTTP on 127.0.0.1")
    p.add_argument("dir", type=Path)
    p.add_argument("--port", type=port_arg, default=8765)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--faults", type=Path, help="JSON list of faults: [{match, fault, times, ...}]")
    p.set_defaults(func=cmd_mirror_serve)


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole chain on a generated month through Dagster (testbed/demo.py, docs/demo.md)."""
    demo, generate = testbed_module("demo"), testbed_module("generate")
    DemoPlan, run_demo, MirrorOptions = demo.DemoPlan, demo.run_demo, generate.MirrorOptions

    options = MirrorOptions(event_scale=args.scale, stories_per_day=args.stories, url_scheme="http")
    plan = DemoPlan(month=args.month, extra_days=args.extra_days, options=options, seed=args.seed)
    return run_demo(plan, Settings.from_env().dataset.data_dir)


def add_demo(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo", parents=[debug], help="the whole chain on a generated month, served on 127.0.0.1, through Dagster"
    )
    p.add_argument(
        "--month", type=month_arg, default=DEMO_MONTH, help="the closed month to split and release (YYYY-MM)"
    )
    p.add_argument("--extra-days", type=count_arg(0), default=3, help="days of the following month to ingest too")
    p.add_argument("--scale", type=share_arg, default=0.1, help="share of GDELT's events per 15-minute slot (0-1]")
    p.add_argument(
        "--stories", type=count_arg(1), default=8, help="well-reported stories per day (they make the test queries)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
