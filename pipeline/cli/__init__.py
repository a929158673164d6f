"""``mirai``: the user's entry point outside the Dagster UI.

Each command's code and parser live together in a module by topic: ``ingest`` (ledger, ingest,
events, gaps), ``mirror`` (mirror generate/serve, demo: testbed/'s code), ``releases`` (split,
release, download, export, import, serve-release), ``scoring`` (score, submit), ``live`` (live
list, live questions, status), ``evaluate`` and ``settings``; ``common`` holds the argument types,
the parser class and the error reporting they share."""

from __future__ import annotations

import argparse
import sys

from pipeline.cli import evaluate, ingest, live, mirror, releases, scoring, settings
from pipeline.cli.common import CommandError, Parser, problem_line
from pipeline.config import env_names

__all__ = ["build_parser", "main"]

# Each command's parser, in the order `mirai --help` lists the commands (not grouped by module).
_COMMANDS = (
    ingest.add_ledger,
    ingest.add_ingest,
    ingest.add_events,
    ingest.add_gaps,
    mirror.add_mirror,
    releases.add_split,
    releases.add_release,
    releases.add_download,
    releases.add_export,
    releases.add_import,
    scoring.add_score,
    evaluate.add_evaluate,
    scoring.add_submit,
    live.add_live,
    live.add_status,
    releases.add_serve_release,
    mirror.add_demo,
    settings.add_settings,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mirai",
        description="mirai-pipeline: GDELT 2.0 ingestion for the MIRAI benchmark.",
        epilog="Settings come from the environment (`mirai settings` lists each with its default and meaning): "
        + ", ".join(env_names()),
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    # Also accepted after the command (`mirai gaps --debug`); SUPPRESS keeps a top-level --debug.
    debug = Parser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in _COMMANDS:
        add_parser(sub, debug)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"mirai {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        command = " ".join(
            filter(
                None,
                [
                    "mirai",
                    args.command,
                    getattr(args, "mirror_command", None),
                    getattr(args, "live_command", None),
                    getattr(args, "format", None),
                ],
            )
        )
        if isinstance(exc, CommandError):
            print(f"{command}: error: {exc}", file=sys.stderr)
            return exc.status
        print(f"{command}: error: {problem_line(exc)} (--debug shows the traceback)", file=sys.stderr)
        return 1
