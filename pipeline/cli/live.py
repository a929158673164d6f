"""`mirai live list`, `mirai live questions D` and `mirai status NAME`: the published live rounds,
a round's questions, read from the release store and verified as `mirai download` verifies a
release (docs/live.md, "Finding a round"), and a submission's public status, a live round's
(docs/live.md, "A submission's status") or a monthly one's (docs/evaluation.md, "A submission's
status")."""

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
    from pipeline.live.publication import store_deadline
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
        # The store's clock decides acceptance: in a replayed round it is far from the published time.
        try:
            due, _ = store_deadline(store, manifest)
        except ReleaseError as exc:
            raise CommandError(str(exc)) from None
        said = (
            f"round {args.round}: {info.get('rows', '?')} questions (sha256 verified), history cutoff "
            f"{manifest['history_cutoff']}, deadline {due.astimezone(UTC).isoformat()} store time "
            f"(published deadline {manifest['deadline']})"
        )
        if args.out is not None:
            print(f"{said}: {args.out}")
            return 0
        data = target.read_bytes()
    # JSON lines only (a JSON string cannot hold a raw control character), and a bidi or invisible
    # character a hostile store put in a name shown as <U+XXXX>: nothing reaches the terminal that
    # could drive it or hide text.
    from pipeline.markdown import visible_text

    try:
        text = data.decode()
        for line in text.splitlines():
            if not isinstance(json.loads(line), dict):
                raise ValueError("not an object")
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        raise CommandError(f"round {args.round}: its questions.jsonl is not JSON lines; not printed") from None
    print(said, file=sys.stderr)
    sys.stdout.write(visible_text(text))
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


def _metric(metrics: dict, name: str) -> str:
    value = metrics.get(name) if isinstance(metrics.get(name), dict) else {}
    point, interval = value.get("value"), value.get("ci95")
    if not isinstance(point, int | float) or isinstance(point, bool):
        return f"{name} -"
    if isinstance(interval, list) and len(interval) == 2 and all(isinstance(v, int | float) for v in interval):
        return f"{name} {point:g} [{interval[0]:g}, {interval[1]:g}]"
    return f"{name} {point:g}"


def _visible(value: object) -> str:
    """Submitter text and a hostile store's, for a terminal: nothing in it may drive the terminal."""
    from pipeline.markdown import visible_text

    return visible_text(str(value)).replace("\n", "<U+000A>").replace("\r", "<U+000D>")


def cmd_status(args: argparse.Namespace) -> int:
    """What became of a submission: a monthly one's verdict and score, or a live one's acceptance
    and its score once resolved. Names are one namespace (submissions/<name>/), so at most one exists."""
    from pipeline.evaluation.submission_status import read_status as read_monthly_status
    from pipeline.release.layout import is_submission_name, shown

    if not is_submission_name(args.name):
        raise CommandError(f"{shown(args.name)} is not a submission name (letters, digits and '._-', at most 64)")
    store = _store(args)
    try:
        monthly = read_monthly_status(store, args.name)
        if monthly is not None:
            _print_monthly_status(args.name, monthly)
            return 0
        _print_live_status(args.name, store)
    except ReleaseError as exc:
        raise CommandError(str(exc)) from None
    return 0


def _print_monthly_status(name: str, status: dict) -> None:
    from pipeline.evaluation.submission_status import SHOWN_METRICS

    text = _visible
    # A metadata field that failed its check is null: said as "?" (a live upload refused before its
    # round could be named has no month at all).
    month = f" for {text(status['month'])}" if status.get("month") else ""
    fields = ", ".join(
        f"{label}{text(status.get(key) if status.get(key) is not None else '?')}"
        for label, key in (("model ", "model"), ("", "query_set"), ("distance ", "distance"))
    )
    print(f"{name}: {status['status']}{month} ({fields})")
    print(f"  uploaded {text(status.get('submitted_at'))} (store time), processed {text(status.get('scored_at'))}")
    for reason in status["reasons"]:
        print(f"  refused: {text(reason)}")
    score = status.get("score")
    if isinstance(score, dict) and isinstance(score.get("metrics"), dict):
        shown = ", ".join(_metric(score["metrics"], m) for m in SHOWN_METRICS)
        print(
            f"  scored over {text(score.get('queries'))} queries ({text(score.get('missing'))} not answered): "
            f"{shown} (95% intervals)"
        )
    if status["status"] == "contaminated":
        print("  never ranked: the knowledge cutoff is not before the month (docs/evaluation.md, 'Submissions')")


def _print_live_status(name: str, store) -> None:
    from pipeline.live.participate import read_status
    from pipeline.live.status import SHOWN_METRICS

    status = read_status(store, name)
    text = _visible
    print(
        f"{name}: {status['status']} for round {status['round']} (model {text(status.get('model'))}"
        f"{', a baseline' if status.get('baseline') is True else ''})"
    )
    print(f"  uploaded {text(status.get('submitted_at'))} (store time), deadline {text(status.get('deadline'))}")
    for reason in status["reasons"]:
        print(f"  refused: {text(reason)}")
    if status["status"] == "accepted":
        print(f"  answered {text(status.get('answered'))} of {text(status.get('questions'))} questions")
        score = status.get("score")
        if score is None:
            print("  not scored yet: no target date of the round is resolved")
        elif score.get("scored") is True and isinstance(score.get("metrics"), dict):
            shown = ", ".join(_metric(score["metrics"], m) for m in SHOWN_METRICS)
            print(
                f"  scored over {text(score.get('resolved_questions'))} of {text(score.get('questions'))} "
                f"questions resolved so far: {shown} (95% intervals)"
            )
        else:
            print(f"  not scored: {text(score.get('reason'))}")


def add_status(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "status", parents=[debug], help="a submission's public status (monthly or live): its verdict and why, its score"
    )
    p.add_argument("name", help="the submission's name (as given to `mirai submit --name`)")
    p.add_argument(
        "--from", dest="source", help="s3://bucket/prefix, file:///path or a path (default MIRAI_RELEASE_URI)"
    )
    p.add_argument("--signed", action="store_true", help="sign requests with AWS credentials (private buckets)")
    p.set_defaults(func=cmd_status)
