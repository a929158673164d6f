"""`mirai ledger`, `ingest`, `events` and `gaps`: a day's GDELT files, its events and the index's
gaps, outside Dagster."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.cli.common import CommandError, check_ordered, day_arg, problem_line
from pipeline.config import Settings
from pipeline.storage import KINDS, DataLayout

# The pipeline.gdelt and pipeline.events modules are imported by the command that runs, not at
# start: each would add 75-110 ms to every `mirai --help`.


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def cmd_ledger(args: argparse.Namespace) -> int:
    from pipeline.gdelt.ledger import problems, read_ledger, summarize, to_markdown

    settings = Settings.from_env()
    ledger = read_ledger(DataLayout(settings.dataset.data_dir), args.day)
    if ledger.height == 0:
        print(
            f"no ledger for {args.day} under {settings.dataset.data_dir} (the day has not been ingested)",
            file=sys.stderr,
        )
        return 1
    counts = summarize(ledger)
    print(f"ledger {args.day}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    if args.all:
        view = ledger.select("slot", "kind", "status", "size", "attempts", "http_status", "last_error")
        with pl.Config(tbl_rows=-1, tbl_width_chars=200, fmt_str_lengths=80):
            print(view)
    else:
        print(to_markdown(problems(ledger), limit=200))
    return 0


def add_ledger(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("ledger", parents=[debug], help="print a day's slot ledger")
    p.add_argument("--day", type=day_arg, required=True)
    p.add_argument("--all", action="store_true", help="every slot, not only the ones needing attention")
    p.set_defaults(func=cmd_ledger)


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline.gdelt.ingest import ingest_day, parse_day

    check_ordered(args.day, args.end, "--day", "--end")
    settings = Settings.from_env()
    for day in _days(args.day, args.end or args.day):
        result = ingest_day(day, settings.dataset, settings.network, settings.gdelt, log=print)
        print(f"{day}: files " + ", ".join(f"{k}={v}" for k, v in result.counts.items() if v))
        for kind in ("export", "mentions"):
            parsed = parse_day(day, kind, settings.dataset, settings.gdelt)
            print(f"{day}: {kind} rows={parsed.rows} rejects={parsed.rejects} parsed_now={parsed.parsed}")
            for path in parsed.quarantined:
                print(f"{day}: {kind} damaged, moved to {path} and parsed again")
            for name, why in parsed.refused.items():
                print(f"{day}: {kind} {name} quarantined: {why}")
    return 0


def add_ingest(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("ingest", parents=[debug], help="land and parse a day (or range) without Dagster")
    p.add_argument("--day", type=day_arg, required=True)
    p.add_argument("--end", type=day_arg, help="last day (inclusive) of a range")
    p.set_defaults(func=cmd_ingest)


def _span(days: list[date]) -> str:
    if not days:
        return "no day"
    return f"{days[0]}" if len(days) == 1 else f"{days[0]}..{days[-1]} ({len(days)} days)"


def cmd_events(args: argparse.Namespace) -> int:
    """Build a day's (or range's) events and daily quads outside Dagster, with exactly the library
    calls of the `events` and `daily_quads` assets (assets/events.py): the same files, byte for byte.

    Each day's events are normalised against every earlier built day (rules 1 and 6), so a range
    is built oldest first and stops at the first day that fails: the days after it would be built
    against a history missing that day. There is no cap on the range: repairing history after an
    early day changed means rebuilding every later day, and a mistyped --end stops at the first
    day that was never ingested, before any work on it.
    """
    from pipeline.events.daily import build_daily_quads, build_events, scan_parsed

    check_ordered(args.day, args.end, "--day", "--end")
    settings = Settings.from_env()
    layout = DataLayout(settings.dataset.data_dir)
    days = _days(args.day, args.end or args.day)
    started = time.perf_counter()
    built: list[date] = []
    events_total = quads_total = 0
    for day in days:
        try:
            # The assets build an empty day from no parsed rows; here that is a day not ingested yet.
            missing = [kind for kind in KINDS if scan_parsed(layout, kind, day) is None]
            if missing:
                raise CommandError(
                    f"no parsed {' or '.join(missing)} files under {layout.root / 'parsed'}: "
                    f"run `mirai ingest --day {day}` first"
                )
            result = build_events(day, settings.dataset)
            quads = build_daily_quads(day, settings.dataset)
        except Exception as exc:
            why = str(exc) if isinstance(exc, CommandError) else f"{problem_line(exc)} (--debug shows the traceback)"
            not_built = days[len(built) :]
            raise CommandError(f"{day}: {why}; built {_span(built)}, not built {_span(not_built)}") from exc
        normalized = result.normalized
        excluded = {reason: count for reason, count in normalized.exclusions.items() if count}
        reasons = ", ".join(f"{reason}={count}" for reason, count in excluded.items())
        print(
            f"{day}: events kept={normalized.events.height} of {normalized.input_rows} rows, "
            f"excluded={sum(excluded.values())}" + (f" ({reasons})" if reasons else "") + f", quads={quads.height}, "
            f"history_days={result.history_days}",
            flush=True,
        )
        built.append(day)
        events_total += normalized.events.height
        quads_total += quads.height
    print(
        f"built events and daily quads of {_span(built)} in {time.perf_counter() - started:.1f}s: "
        f"{events_total} events, {quads_total} quads"
    )
    return 0


def add_events(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "events",
        parents=[debug],
        help="build a day's (or range's) events and daily quads from its parsed files without Dagster",
        description="Build events and daily quads as the `events` and `daily_quads` assets do (same code, "
        "same files), oldest day first: each day's events depend on every earlier day's. Stops at the "
        "first day that fails.",
    )
    p.add_argument("--day", type=day_arg, required=True, help="first day (YYYY-MM-DD); it must be ingested")
    p.add_argument("--end", type=day_arg, help="last day (inclusive) of a range, built oldest first")
    p.set_defaults(func=cmd_events)


def cmd_gaps(args: argparse.Namespace) -> int:
    from pipeline.gdelt.index import parse_index, slot_gaps

    check_ordered(args.start, args.end, "--start", "--end")
    path = args.index or DataLayout(Settings.from_env().dataset.data_dir).index_dir() / "masterfilelist.txt"
    if not Path(path).is_file():
        hint = "" if args.index else " (no day has been ingested yet: pass --index FILE)"
        raise CommandError(f"no GDELT index file at {path}{hint}")
    table = parse_index(Path(path).read_bytes())
    entries = table.entries
    if entries.height == 0:
        print(f"{path}: no entries", file=sys.stderr)
        return 1
    start = entries["slot"].min() if args.start is None else datetime.combine(args.start, datetime.min.time(), UTC)
    end = (
        entries["slot"].max()
        if args.end is None
        else datetime.combine(args.end, datetime.min.time(), UTC) + timedelta(hours=23, minutes=45)
    )
    gaps = slot_gaps(entries, start, end)
    print(
        f"{path}: {entries.height} entries, {table.bad_lines.height} malformed lines, {gaps.height} slots with gaps in {start} .. {end}"
    )
    for slot, kinds in gaps.iter_rows():
        print(f"  {slot:%Y-%m-%d %H:%M} UTC  missing {'+'.join(kinds)}")
    for line_number, line in table.bad_lines.iter_rows():
        print(f"  malformed line {line_number}: {line[:120]!r}")
    return 0


def add_gaps(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("gaps", parents=[debug], help="report slots missing from a GDELT index file")
    p.add_argument("--index", type=Path, help="a masterfilelist.txt (default: the cached copy)")
    p.add_argument("--start", type=day_arg)
    p.add_argument("--end", type=day_arg)
    p.set_defaults(func=cmd_gaps)
