"""`mirai live list` and `mirai live questions D`: the published live rounds and a round's
questions, read from the release store and verified as `mirai download` verifies a release
(docs/live.md, "Finding a round")."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from pipeline.cli.common import CommandError, count_arg, day_arg
from pipeline.config import Settings
from pipeline.release.layout import ReleaseError

# The release-store and live modules are imported by the command that runs, not at start (as in
# the other command modules: they would slow every `mirai --help`).


def _store(args: argparse.Namespace):
    from pipeline.release.store_uri import open_store

    settings = Settings.from_env()
    return open_store(
        settings.dataset,
        settings.network,
        settings.release,
        uri=args.source,
        signed=args.signed or settings.release.signed_download,
    )


def cmd_live_list(args: argparse.Namespace) -> int:
    """The newest published rounds: deadline, target dates, open or closed on the store's clock."""
    from pipeline.live.participate import read_index, status
    from pipeline.release.download import ChecksumMismatch

    store = _store(args)
    try:
        listed = read_index(store)[: args.last]
        now = datetime.now(UTC)
        rows = [(entry, *status(store, entry, now)) for entry in listed]
    except ChecksumMismatch as exc:
        print(f"checksum mismatch: {exc}", file=sys.stderr)
        return 3
    except ReleaseError as exc:
        raise CommandError(str(exc)) from None
    print(f"{'round':<10}  {'deadline (published)':<25}  {'target dates':<22}  status")
    for entry, _, said in rows:
        deadline = entry.deadline.astimezone(UTC).isoformat()
        print(f"{entry.day:<10}  {deadline:<25}  {', '.join(entry.target_dates):<22}  {said}")
    opened = sum(1 for _, is_open, _ in rows if is_open)
    print(f"{opened} open, {len(rows) - opened} closed (the {len(rows)} newest rounds at {store.description})")
    return 0


def cmd_live_questions(args: argparse.Namespace) -> int:
    """The round's questions.jsonl, verified against its manifest (itself against live/index.json):
    printed, or written to --out."""
    from pipeline.live.participate import download_questions
    from pipeline.release.download import ChecksumMismatch

    store = _store(args)
    with tempfile.TemporaryDirectory(prefix="mirai-live-") as private:
        target = args.out if args.out is not None else Path(private) / "questions.jsonl"
        try:
            manifest = download_questions(store, args.round, target)
        except ChecksumMismatch as exc:
            print(f"checksum mismatch: {exc}", file=sys.stderr)
            return 3
        except ReleaseError as exc:
            raise CommandError(str(exc)) from None
        info = manifest["files"]["questions.jsonl"]
        said = (
            f"round {args.round}: {info.get('rows', '?')} questions (sha256 verified), history cutoff "
            f"{manifest['history_cutoff']}, deadline {manifest['deadline']}"
        )
        if args.out is not None:
            print(f"{said}: {args.out}")
            return 0
        data = target.read_bytes()
    # JSON lines only: a JSON string cannot hold a raw control character, so nothing reaches the
    # terminal that could drive it.
    try:
        for line in data.splitlines():
            if not isinstance(json.loads(line), dict):
                raise ValueError("not an object")
    except ValueError:
        raise CommandError(f"round {args.round}: its questions.jsonl is not JSON lines; not printed") from None
    print(said, file=sys.stderr)
    sys.stdout.write(data.decode())
    return 0


def add_live(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("live", parents=[debug], help="the live rounds: list them, fetch a round's questions")
    source = argparse.ArgumentParser(add_help=False)
    source.add_argument(
        "--from", dest="source", help="s3://bucket/prefix, file:///path or a path (default MIRAI_RELEASE_URI)"
    )
    source.add_argument("--signed", action="store_true", help="sign requests with AWS credentials (private buckets)")
    live = p.add_subparsers(dest="live_command", required=True)
    listing = live.add_parser(
        "list", parents=[debug, source], help="the newest rounds: deadlines, target dates, open or closed"
    )
    listing.add_argument("--last", type=count_arg(1), default=20, metavar="N", help="the N newest rounds (default 20)")
    listing.set_defaults(func=cmd_live_list)
    questions = live.add_parser(
        "questions", parents=[debug, source], help="a round's questions.jsonl, verified against its manifest"
    )
    questions.add_argument("round", type=day_arg, metavar="D", help="the round's day YYYY-MM-DD")
    questions.add_argument("--out", type=Path, help="write the file here (default: print it)")
    questions.set_defaults(func=cmd_live_questions)
