"""``mirai``: the user's entry point outside the Dagster UI."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.config import Settings, env_names


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from exc


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from exc
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1] of GDELT's events per slot, got {text}")
    return value


def _count(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from exc
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"expected {bounds}, got {value}")
        return value

    return parse


_port = _count(0, 65535)


class CommandError(Exception):
    """A command cannot run as asked: main() prints the message as one line and exits with ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _testbed(module: str):
    """A module of testbed/, the demo's and tests' stand-ins (GDELT mirror, news sites, S3 server):
    it ships with the source checkout, not with the library (the Docker image has none)."""
    import importlib

    try:
        return importlib.import_module(f"testbed.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("testbed", f"testbed.{module}"):
            raise
        raise CommandError(
            "this command needs testbed/ (the generated mirror, news sites and S3 server), "
            "which ships with the source checkout, not with this install"
        ) from None


def _ordered(start: date | None, end: date | None, start_flag: str, end_flag: str) -> None:
    if start is not None and end is not None and end < start:
        raise CommandError(f"{end_flag} {end} is before {start_flag} {start}: nothing to do", status=2)


def cmd_ledger(args: argparse.Namespace) -> int:
    from pipeline.gdelt.ledger import problems, read_ledger, summarize, to_markdown
    from pipeline.storage import DataLayout

    settings = Settings.from_env()
    ledger = read_ledger(DataLayout(settings.data_dir), args.day)
    if ledger.height == 0:
        print(f"no ledger for {args.day} under {settings.data_dir} (the day has not been ingested)", file=sys.stderr)
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


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline.gdelt.ingest import ingest_day, parse_day

    _ordered(args.day, args.end, "--day", "--end")
    settings = Settings.from_env()
    for day in _days(args.day, args.end or args.day):
        result = ingest_day(day, settings, log=print)
        print(f"{day}: files " + ", ".join(f"{k}={v}" for k, v in result.counts.items() if v))
        for kind in ("export", "mentions"):
            parsed = parse_day(day, kind, settings)
            print(f"{day}: {kind} rows={parsed.rows} rejects={parsed.rejects} parsed_now={parsed.parsed}")
            for path in parsed.quarantined:
                print(f"{day}: {kind} damaged, moved to {path} and parsed again")
            for name, why in parsed.refused.items():
                print(f"{day}: {kind} {name} quarantined: {why}")
    return 0


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
    from pipeline.storage import KINDS, DataLayout

    _ordered(args.day, args.end, "--day", "--end")
    settings = Settings.from_env()
    layout = DataLayout(settings.data_dir)
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
            result = build_events(day, settings)
            quads = build_daily_quads(day, settings)
        except Exception as exc:
            why = str(exc) if isinstance(exc, CommandError) else f"{_problem(exc)} (--debug shows the traceback)"
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


def cmd_gaps(args: argparse.Namespace) -> int:
    from pipeline.gdelt.index import parse_index, slot_gaps
    from pipeline.storage import DataLayout

    _ordered(args.start, args.end, "--start", "--end")
    path = args.index or DataLayout(Settings.from_env().data_dir).index_dir() / "masterfilelist.txt"
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


def cmd_mirror_generate(args: argparse.Namespace) -> int:
    generate = _testbed("generate")
    generate_mirror, MirrorOptions = generate.generate_mirror, generate.MirrorOptions

    _ordered(args.start, args.end, "--start", "--end")
    started = time.perf_counter()
    # --scale 1 gives the default options, so a default mirror keeps its bytes (and its manifest).
    options = MirrorOptions(event_scale=args.scale)
    manifest = generate_mirror(Path(args.out), args.start, args.end, seed=args.seed, slots=args.slots, options=options)
    print(json.dumps(manifest.get("totals", {}), indent=2))
    print(f"mirror written to {args.out} in {time.perf_counter() - started:.1f}s")
    return 0


def cmd_mirror_serve(args: argparse.Namespace) -> int:
    MirrorServer = _testbed("serve").MirrorServer

    if not args.dir.is_dir():
        raise CommandError(f"no mirror directory at {args.dir} (`mirai mirror generate --out DIR` writes one)")
    server = MirrorServer(Path(args.dir), port=args.port, latency_s=args.latency_ms / 1000.0, faults_file=args.faults)
    print(f"serving {args.dir} at {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


DEMO_MONTH = date(2024, 1, 1)


def _month(text: str) -> date:
    try:
        return date.fromisoformat(f"{text}-01" if len(text) == 7 else text).replace(day=1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid month {text!r}: expected YYYY-MM") from exc


def _release_name(text: str) -> str:
    """``latest`` or a real month YYYY-MM (2024-13 is refused here, not reported as unpublished)."""
    if text == "latest":
        return text
    if len(text) != 7:
        raise argparse.ArgumentTypeError(f"invalid month {text!r}: expected latest or YYYY-MM")
    return f"{_month(text):%Y-%m}"


def cmd_split(args: argparse.Namespace) -> int:
    """Build a month's event database and test split outside Dagster (same code as the assets)."""
    from pipeline.http import utc_now
    from pipeline.splits.database import MonthNotReady, build_event_database
    from pipeline.splits.split import Override, build_split, month_closure

    settings = Settings.from_env()
    now = utc_now()
    if args.check:
        closure = month_closure(args.month, settings, now)
        print(closure.describe())
        return 0 if closure.closed else 1
    if bool(args.override_by) != bool(args.override_reason):
        print("an override needs both --override-by and --override-reason", file=sys.stderr)
        return 2
    override = Override(args.override_by, args.override_reason, now) if args.override_by else None
    try:
        db = build_event_database(args.month, settings)
        split = build_split(args.month, settings, now=now, override=override)
    except MonthNotReady as exc:
        print(f"not built: {exc}", file=sys.stderr)
        return 1
    print(f"event database {args.month:%Y-%m}: {db.counts['events']} quads, {db.counts['news']} articles")
    print(f"split {split.directory}: {split.queries.height} queries, sample {split.sample.height}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """Publish a month's release outside Dagster (same code as the `release` asset)."""
    from pipeline.release.download import ProgressBar
    from pipeline.release.layout import ReleaseError
    from pipeline.release.publish import publish_release, release_sources
    from pipeline.release.store import open_store

    settings = Settings.from_env()
    try:
        store = open_store(settings)
        # Sized from the files, not from a plan: planning may hash files, and publish_release
        # uploads a new month's files as they are planned.
        bar = ProgressBar(sum(f.path.stat().st_size for f in release_sources(args.month, settings).files))
        try:
            result = publish_release(
                args.month,
                settings,
                store,
                progress=bar,
                log=bar.file if bar.enabled else (lambda message: print(message, file=sys.stderr)),
            )
        finally:
            bar.close()
    except ReleaseError as exc:
        print(f"not published: {exc}", file=sys.stderr)
        return 1
    state = "published" if result.changed else "already published, verified, nothing changed"
    print(
        f"release {result.month} {state} at {result.store}: {len(result.uploaded)} files uploaded "
        f"({result.bytes_uploaded:,} bytes), {len(result.verified)} verified; manifest {result.manifest_url}"
    )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    """Download and verify a published release (anonymous unless --signed or configured)."""
    from pipeline.release.download import ChecksumMismatch, download_release
    from pipeline.release.layout import ReleaseError
    from pipeline.release.store import open_store

    settings = Settings.from_env()
    try:
        store = open_store(settings, uri=args.source, signed=args.signed or settings.release_signed_download)
        result = download_release(
            store, args.release, args.dest, only=args.only, workers=settings.release_concurrency, durable=args.fsync
        )
    except ChecksumMismatch as exc:
        print(f"checksum mismatch: {exc}", file=sys.stderr)
        return 3
    except ReleaseError as exc:
        print(f"download failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"release {result.release} in {result.directory}: {len(result.downloaded)} files downloaded "
        f"({result.bytes_downloaded:,} bytes), {len(result.already_verified)} already there; all sha256 verified"
    )
    return 0


def cmd_export_mirai(args: argparse.Namespace) -> int:
    """Write a month's database and split as the files MIRAI's scripts read (docs/mirai.md)."""
    from pipeline.splits.mirai_files import ExportError, export_mirai

    try:
        result = export_mirai(args.month, Settings.from_env().data_dir, args.out)
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"MIRAI files for {result.month} (database {result.database_months[0]}..{result.database_months[-1]}) in "
        f"{result.directory}: copy its data/ into a MIRAI checkout; the embedding files are yours to make"
    )
    return 0


def cmd_import_mirai(args: argparse.Namespace) -> int:
    """Read MIRAI's published files into a data directory of ours (docs/mirai.md)."""
    from pipeline.splits.mirai_files import ExportError, MiraiFormatError, import_mirai

    settings = Settings.from_env()
    target = args.data or settings.data_dir / "imports" / "mirai"
    try:
        result = import_mirai(args.dir, target, distance_days=settings.agent_distance_days)
    except (MiraiFormatError, ExportError) as exc:
        raise CommandError(f"{exc}; nothing was written") from None
    print(
        f"imported {result.events} events, {result.news} articles and the {result.month} split "
        f"({result.queries} queries, sample {result.sample}) into {result.data_dir}; "
        f"set MIRAI_DATA_DIR={result.data_dir} to evaluate on it"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole chain on a generated month through Dagster (testbed/demo.py, docs/demo.md)."""
    demo, generate = _testbed("demo"), _testbed("generate")
    DemoPlan, run_demo, MirrorOptions = demo.DemoPlan, demo.run_demo, generate.MirrorOptions

    options = MirrorOptions(event_scale=args.scale, stories_per_day=args.stories, url_scheme="http")
    plan = DemoPlan(month=args.month, extra_days=args.extra_days, options=options, seed=args.seed)
    return run_demo(plan, Settings.from_env().data_dir)


def cmd_export_predictions(args: argparse.Namespace) -> int:
    """A stored evaluation run's predictions in MIRAI's layout (OUT/round<N>/<QueryId>.json)."""
    from pipeline.evaluation.mirai_predictions import export_predictions, mirai_query_ids
    from pipeline.storage import DataLayout

    directory = DataLayout(Settings.from_env().data_dir).evaluation_dir(
        args.month, args.agent, args.query_set, args.distance
    )
    if not (directory / "results.parquet").is_file():
        raise CommandError(
            f"no stored run at {directory} (month {args.month:%Y-%m}, agent {args.agent}, query set {args.query_set}, "
            f"distance {args.distance}): `mirai` evaluations are stored by the evaluation asset"
        )
    query_ids = None
    if args.relation_query is not None:
        queries = pl.read_parquet(directory / "results.parquet", columns=["query_id", "date", "s", "o"]).unique(
            "query_id", maintain_order=True
        )
        try:
            query_ids = mirai_query_ids(queries, args.relation_query)
        except ValueError as exc:  # a wrong or oversized file; polars' parse errors are ValueErrors too
            raise CommandError(str(exc).splitlines()[0]) from None
    written = export_predictions(directory, args.out, query_ids)
    files = sum(len(paths) for paths in written.values())
    named = f"QueryIds of {args.relation_query}" if query_ids is not None else "our query ids"
    print(f"{files} prediction files in {len(written)} round(s) under {args.out} (file names: {named})")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """Score a predictions file against a split (docs/evaluation.md, "Score your own predictions")."""
    from pipeline.evaluation.scoring import (
        InvalidPredictions,
        ScoringError,
        bounded,
        score_predictions,
        split_directory,
    )
    from pipeline.storage import atomic_write_bytes

    try:
        data_dir = None if Path(args.split).is_dir() else Settings.from_env().data_dir
        directory = split_directory(args.split, data_dir)
        result = score_predictions(
            args.predictions,
            directory,
            sample=args.sample,
            distance=args.distance,
            seed=args.seed,
            resamples=args.resamples,
            lenient=args.lenient,
            relation_query=args.relation_query,
        )
    except InvalidPredictions as exc:
        for line in bounded(exc.problems):
            print(line, file=sys.stderr)
        raise CommandError(str(exc)) from None
    except ScoringError as exc:
        raise CommandError(str(exc)) from None
    for line in bounded(result.forgiven):
        print(f"forgiven: {line}", file=sys.stderr)
    for line in bounded(result.missing):
        print(f"missing (scored as empty): {line}", file=sys.stderr)
    if args.out is not None:
        atomic_write_bytes(args.out / "scorecard.json", result.json_bytes())
        atomic_write_bytes(args.out / "scorecard.md", result.markdown().encode())
    print(result.markdown(), end="")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """Check a predictions file and its submission.json as the pipeline will, then upload them to the
    release store's submissions/ (docs/evaluation.md, "Submissions")."""
    from pipeline.evaluation.scoring import InvalidPredictions, ScoringError, bounded, split_directory
    from pipeline.evaluation.submissions import (
        LiveMetadata,
        SubmissionError,
        check_name_free,
        cutoff_rule,
        prepare,
        score_locally,
    )
    from pipeline.live.submissions import check_live_locally
    from pipeline.release.store import open_store

    prepared, problems = prepare(args.name, args.predictions, args.meta)
    if prepared is None:
        for line in bounded(problems):
            print(line, file=sys.stderr)
        raise CommandError(f"{len(problems)} problem(s); nothing was uploaded")
    settings = Settings.from_env()
    store = open_store(settings, uri=args.store)
    try:
        check_name_free(store, prepared.name)
    except SubmissionError as exc:
        raise CommandError(str(exc)) from None
    if isinstance(prepared.meta, LiveMetadata):
        manifest, problems = check_live_locally(prepared, store)
        if problems:
            for line in bounded(problems):
                print(line, file=sys.stderr)
            raise CommandError(f"{len(problems)} problem(s); nothing was uploaded")
        deadline = manifest.get("deadline")
        print(f"round {prepared.meta.round}: accepted if the upload reaches the store before its deadline {deadline}")
        return _upload(store, prepared)
    month = prepared.meta.month
    try:
        split = split_directory(str(args.split) if args.split else month, settings.data_dir)
    except ScoringError as exc:
        if args.split:
            raise CommandError(str(exc)) from None
        print(f"not scored here ({exc}); the pipeline scores it against its own {month} split", file=sys.stderr)
    else:
        try:
            result = score_locally(prepared, split)
        except InvalidPredictions as exc:
            for line in bounded(exc.problems):
                print(line, file=sys.stderr)
            raise CommandError(f"{len(exc.problems)} problem(s) in the predictions; nothing was uploaded") from None
        except ScoringError as exc:
            raise CommandError(f"{exc}; nothing was uploaded") from None
        print(result.markdown(), end="")
    eligible, why = cutoff_rule(prepared.meta)
    if not eligible:
        print(why, file=sys.stderr)
    return _upload(store, prepared)


def _upload(store, prepared) -> int:
    from pipeline.evaluation.submissions import SubmissionError, upload

    try:
        upload(store, prepared)
    except SubmissionError as exc:
        raise CommandError(str(exc)) from None
    print(f"submitted {prepared.name!r} to {store.description} (submissions/{prepared.name}/)")
    return 0


def cmd_serve_release(args: argparse.Namespace) -> int:
    """Serve the store `mirai demo` published to, on a stable port (testbed/demo.py)."""
    import socket

    serve_release = _testbed("demo").serve_release
    port = args.port or _testbed("s3").SERVE_PORT
    data_dir = Settings.from_env().data_dir.resolve()
    if not (data_dir / "s3" / "data").is_dir():
        raise CommandError(
            f"no demo release store at {data_dir / 's3'}: run `mirai demo` first "
            "(or set MIRAI_DATA_DIR to the demo's data directory)"
        )
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as weed's own listener: TIME_WAIT is no obstacle
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CommandError(f"port {port} on 127.0.0.1 is not free ({exc.strerror}): pass --port N") from exc
    serve_release(data_dir, port)
    return 0


# `mirai evaluate`'s flags for the agents.yaml fields they fill (docs/evaluation.md, "The agent
# registry"): the registry validates them, and its messages name the field, said here as the flag.
_ENDPOINT_FLAGS = {
    "base_url": "endpoint",
    "model": "model",
    "api_key_env": "api_key_env",
    "requests_per_minute": "requests_per_minute",
    "tokens_per_minute": "tokens_per_minute",
}
# The llm entry's other fields are flags of the same name (dashes for underscores), but those the
# command sets itself (name, kind, distances from --distance, endpoint from the flags above) and
# gguf (a local model file, not an endpoint).
_NOT_FLAGS = {"name", "kind", "distances", "endpoint", "gguf"}


def _agent_flags() -> list[str]:
    from pipeline.evaluation.registry import LLM_FIELDS

    return sorted(LLM_FIELDS - _NOT_FLAGS)


EVALUATE_AGENT_NAME = "agent"  # names the stored run's directory under --run-dir


def _as_flags(message: str) -> str:
    """A registry message with each field it names said as the `mirai evaluate` flag."""
    names = {f"endpoint.{field}": flag for field, flag in _ENDPOINT_FLAGS.items()} | {f: f for f in _agent_flags()}
    names["distances"] = names["every distance"] = "distance"
    pattern = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<![\w.]){pattern}(?![\w])", lambda m: "--" + names[m.group(0)].replace("_", "-"), message)


def evaluate_registry_entry(args: argparse.Namespace) -> dict:
    """The agents.yaml entry the flags describe; flags not given are left out, so the registry's
    defaults apply as they do to a written entry."""
    endpoint = {field: getattr(args, flag) for field, flag in _ENDPOINT_FLAGS.items()}
    entry = {field: getattr(args, field) for field in _agent_flags()}
    entry |= {"endpoint": {k: v for k, v in endpoint.items() if v is not None}, "distances": [args.distance]}
    return {"name": EVALUATE_AGENT_NAME, "kind": "llm"} | {k: v for k, v in entry.items() if v is not None}


def _stored_run_matches(directory: Path, agent, client_settings, query_ids: list[str]) -> bool:
    """Whether ``directory`` holds a finished run of this agent entry and harness on these queries,
    so a re-run writes its predictions again instead of redoing its episodes."""
    from pipeline.evaluation.prompts import PROMPT_VERSION
    from pipeline.evaluation.run import agent_config_hash

    try:
        record = json.loads((directory / "scores.json").read_text())
        stored_ids = pl.read_parquet(directory / "results.parquet", columns=["query_id"]).get_column("query_id")
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return False
    harness = record.get("harness") or {}
    return (
        record.get("agent_config_hash") == agent_config_hash(agent)
        and harness.get("prompt_version") == PROMPT_VERSION
        and harness.get("max_tokens") == client_settings.max_tokens
        and harness.get("seed") == client_settings.seed
        and sorted(stored_ids.unique().to_list()) == sorted(query_ids)
    )


def _write_predictions(directory: Path, out: Path) -> int:
    """The stored run's predictions as `mirai score` and `mirai submit` read them: one JSONL line
    per query ({query_id, answer, ranked}) for a .jsonl ``out`` (one round), else MIRAI's
    round<N>/<QueryId>.json files under ``out``. Written atomically; returns the predictions."""
    from pipeline.evaluation.mirai_predictions import export_predictions
    from pipeline.storage import atomic_write_bytes

    if out.suffix != ".jsonl":
        return sum(len(paths) for paths in export_predictions(directory, out).values())
    results = pl.read_parquet(directory / "results.parquet", columns=["query_id", "prediction", "ranked"])
    lines = [
        json.dumps({"query_id": query_id, "answer": json.loads(prediction), "ranked": list(ranked)})
        for query_id, prediction, ranked in results.iter_rows()
    ]
    atomic_write_bytes(out, ("\n".join(lines) + "\n").encode())
    return len(lines)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Run an LLM agent through the evaluation harness (pipeline/evaluation/run.py) on a downloaded
    release, with no Dagster and no agents.yaml (docs/evaluate-your-agent.md, "3. Run an agent")."""
    from pipeline.agent_api import EventDatabase
    from pipeline.agent_api.environment import DatabaseFileError
    from pipeline.evaluation.clients import client_for
    from pipeline.evaluation.llm import ClientSettings, ModelUnavailable
    from pipeline.evaluation.registry import RegistryError, parse_agents
    from pipeline.evaluation.run import (
        InvalidQueries,
        checkpoint_path,
        endpoint_limits,
        evaluate_agent,
        release_queries,
    )
    from pipeline.evaluation.throughput import RateLimiter
    from pipeline.release.layout import ReleaseError
    from pipeline.storage import DataLayout

    release, out = args.release, args.out
    query_set = {"sample": "queries_sample", "all": "queries"}[args.queries]
    queries_file = release / f"{query_set}.parquet"
    if not queries_file.is_file() or not (release / "database" / "events").is_dir():
        raise CommandError(
            f"{release} is not a downloaded release month (it needs {query_set}.parquet and database/): "
            "`mirai download YYYY-MM` fetches one (without --only)"
        )
    try:
        (agent,) = parse_agents({"agents": [evaluate_registry_entry(args)]}, source="flags")
    except RegistryError as exc:
        message = _as_flags(str(exc).split(": ", 2)[-1])
        if args.api_key_env is not None:  # a key given in its place is not echoed
            message = message.replace(repr(args.api_key_env), "a value not shown (it may be a key)")
        raise CommandError(message, status=2) from None
    if args.api_key_env is not None and args.api_key_env not in os.environ:
        raise CommandError(
            "--api-key-env names an environment variable that is not set: export the key in it "
            "(the name is not shown, in case it is the key itself)",
            status=2,
        )
    if out.suffix == ".jsonl" and agent.rounds > 1:
        raise CommandError(
            f"--rounds {agent.rounds} gives one prediction per query per round: give --out a directory "
            "(MIRAI's round<N>/ files) instead of a .jsonl file",
            status=2,
        )
    run_dir = args.run_dir or out.with_name(out.name + ".run")
    try:  # the directory may be one anyone handed over, not `mirai download`'s: checked before use
        frame = release_queries(release, query_set)
    except (InvalidQueries, ReleaseError) as exc:
        raise CommandError(str(exc)) from None
    distance = agent.distances[0]
    harness = {"max_tokens": args.max_tokens, "seed": args.seed}
    client_settings = ClientSettings(**{k: v for k, v in harness.items() if v is not None})
    directory = DataLayout(run_dir).evaluation_dir(
        frame.get_column("date").min().replace(day=1), agent.name, query_set, distance
    )
    episodes = agent.rounds * frame.height
    limiter = RateLimiter(endpoint_limits(agent))  # here, not in the harness, so the run can say what it waited
    if _stored_run_matches(directory, agent, client_settings, frame.get_column("query_id").to_list()):
        record = json.loads((directory / "scores.json").read_text())
        print(f"{release.name} {query_set}: already evaluated with these settings in {directory}; no episode re-run")
    else:
        resumed = checkpoint_path(directory).is_file()
        print(
            f"{release.name} {query_set}: {frame.height} queries x {agent.rounds} round(s) = {episodes} episodes of "
            f"{agent.endpoint.model} at {agent.endpoint.base_url}, distance {distance}"
            + (f"; resuming from {checkpoint_path(directory)}" if resumed else ""),
            flush=True,
        )
        database = None
        if agent.strategy == "react":
            database = EventDatabase(
                release, allow_unconfined_sandbox=Settings.from_env().sandbox_allow_unconfined, untrusted_files=True
            )
            try:  # every month the run reads, loaded and checked now: a bad file refuses the run, not its episodes
                database.gated_tables(frame.get_column("date").max() - timedelta(days=distance))
            except DatabaseFileError as exc:
                raise CommandError(str(exc)) from None
        try:
            with contextlib.closing(client_for(agent, client_settings, limiter)) as client:
                _, record = evaluate_agent(
                    queries_file,
                    run_dir,
                    agent,
                    distance,
                    force=True,  # a contaminated run is still scored; said below, and on the leaderboard
                    client=client,
                    client_settings=client_settings,
                    database=database,
                    progress=lambda line: print(line, flush=True),
                    progress_interval_s=args.progress_every,
                )
        except ModelUnavailable as exc:
            kept = checkpoint_path(directory)
            raise CommandError(
                f"{exc}" + (f"; finished episodes are kept in {kept}" if kept.is_file() else "")
            ) from None
    written = _write_predictions(directory, out)
    if record["contaminated"]:
        print(f"contaminated: {record['eligibility']}", file=sys.stderr)
    cost = f", cost ${record['cost_usd']:.4f}" if record.get("cost_usd") is not None else ""
    print(
        f"{written} predictions in {out}; end states {record['end_states']}; tokens in/out "
        f"{record['tokens_in']}/{record['tokens_out']}{cost}; trajectories and scores.json in {directory}"
    )
    if limiter.throttles or limiter.waited_s:
        print(
            f"rate limits: waited {limiter.waited_s:.1f} s in all, {limiter.throttles} 429 response(s) from the endpoint"
        )
    sample = " --sample" if query_set == "queries_sample" else ""
    print(f"next: mirai score {out} --split {release}{sample} --distance {distance}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mirai",
        description="mirai-pipeline: GDELT 2.0 ingestion for the MIRAI benchmark.",
        epilog="Settings come from the environment: " + ", ".join(env_names().values()),
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    # Also accepted after the command (`mirai gaps --debug`); SUPPRESS keeps a top-level --debug.
    debug = _Parser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ledger", parents=[debug], help="print a day's slot ledger")
    p.add_argument("--day", type=_day, required=True)
    p.add_argument("--all", action="store_true", help="every slot, not only the ones needing attention")
    p.set_defaults(func=cmd_ledger)

    p = sub.add_parser("ingest", parents=[debug], help="land and parse a day (or range) without Dagster")
    p.add_argument("--day", type=_day, required=True)
    p.add_argument("--end", type=_day, help="last day (inclusive) of a range")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser(
        "events",
        parents=[debug],
        help="build a day's (or range's) events and daily quads from its parsed files without Dagster",
        description="Build events and daily quads as the `events` and `daily_quads` assets do (same code, "
        "same files), oldest day first: each day's events depend on every earlier day's. Stops at the "
        "first day that fails.",
    )
    p.add_argument("--day", type=_day, required=True, help="first day (YYYY-MM-DD); it must be ingested")
    p.add_argument("--end", type=_day, help="last day (inclusive) of a range, built oldest first")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("gaps", parents=[debug], help="report slots missing from a GDELT index file")
    p.add_argument("--index", type=Path, help="a masterfilelist.txt (default: the cached copy)")
    p.add_argument("--start", type=_day)
    p.add_argument("--end", type=_day)
    p.set_defaults(func=cmd_gaps)

    mirror = sub.add_parser(
        "mirror", parents=[debug], help="a generated GDELT mirror for demos and tests"
    ).add_subparsers(dest="mirror_command", required=True)
    p = mirror.add_parser("generate", parents=[debug], help="write deterministic GDELT-format sample data")
    p.add_argument("--start", type=_day, required=True)
    p.add_argument("--end", type=_day, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slots", type=_count(1), help="only the first N 15-minute slots (fast partial mirrors)")
    p.add_argument(
        "--scale",
        type=_share,
        default=1.0,
        help="share of GDELT's events per 15-minute slot, in (0, 1] (default 1: GDELT's volume; a smaller "
        "share makes a smaller mirror that later steps get through faster, as `mirai demo --scale`)",
    )
    p.set_defaults(func=cmd_mirror_generate)
    p = mirror.add_parser("serve", parents=[debug], help="serve a mirror over HTTP on 127.0.0.1")
    p.add_argument("dir", type=Path)
    p.add_argument("--port", type=_port, default=8765)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--faults", type=Path, help="JSON list of faults: [{match, fault, times, ...}]")
    p.set_defaults(func=cmd_mirror_serve)

    p = sub.add_parser("split", parents=[debug], help="build a closed month's event database and test split")
    p.add_argument("--month", type=_month, required=True, help="YYYY-MM")
    p.add_argument("--check", action="store_true", help="only say whether the month is closed (exit 1 if not)")
    p.add_argument("--override-by", default="", help="operator forcing an open month (recorded in the manifest)")
    p.add_argument("--override-reason", default="", help="why the month is forced (recorded in the manifest)")
    p.set_defaults(func=cmd_split)

    p = sub.add_parser(
        "release", parents=[debug], help="publish a month's release to MIRAI_RELEASE_URI (immutable; re-runs verify)"
    )
    p.add_argument("--month", type=_month, required=True, help="YYYY-MM")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("download", parents=[debug], help="download and verify a published release")
    p.add_argument("release", nargs="?", default="latest", type=_release_name, help="latest (default) or YYYY-MM")
    p.add_argument("--dest", type=Path, default=Path("mirai-releases"), help="files go to DEST/YYYY-MM/")
    p.add_argument(
        "--only",
        choices=("split", "database", "mirai"),
        help="only the split (queries, card, figures), the database, or MIRAI's files (mirai/data/)",
    )
    p.add_argument(
        "--from", dest="source", help="s3://bucket/prefix, file:///path or a path (default MIRAI_RELEASE_URI)"
    )
    p.add_argument("--signed", action="store_true", help="sign requests with AWS credentials (private buckets)")
    p.add_argument(
        "--fsync",
        action="store_true",
        help="fsync every file before writing manifest.json (survives a power cut; slower on busy disks)",
    )
    p.set_defaults(func=cmd_download)

    export = sub.add_parser("export", parents=[debug], help="write data in another benchmark's layout").add_subparsers(
        dest="format", required=True
    )
    p = export.add_parser("mirai", parents=[debug], help="a month's database and split as MIRAI's data/ files")
    p.add_argument("--month", type=_month, required=True, help="YYYY-MM (the split's month)")
    p.add_argument("--out", type=Path, required=True, help="a new or empty directory (or an earlier export)")
    p.set_defaults(func=cmd_export_mirai)

    p = export.add_parser(
        "predictions", parents=[debug], help="a stored evaluation run's predictions as MIRAI writes them"
    )
    p.add_argument("--month", type=_month, required=True, help="YYYY-MM")
    p.add_argument("--agent", required=True, help="the agent's name in the registry")
    p.add_argument("--query-set", default="queries", help="queries (default) or queries_sample")
    p.add_argument("--distance", type=_count(1), default=1, help="days between the cutoff and the query (default 1)")
    p.add_argument("--out", type=Path, required=True, help="files go to OUT/round<N>/<QueryId>.json")
    p.add_argument("--relation-query", type=Path, help="name files by the QueryIds of this MIRAI relation_query.csv")
    p.set_defaults(func=cmd_export_predictions)

    imports = sub.add_parser(
        "import", parents=[debug], help="read data from another benchmark's layout"
    ).add_subparsers(dest="format", required=True)
    p = imports.add_parser("mirai", parents=[debug], help="MIRAI's data/ files into a data directory of ours")
    p.add_argument("dir", type=Path, help="a directory holding data/MIRAI/ (or data/MIRAI itself)")
    p.add_argument("--data", type=Path, help="the data directory to write (default: $MIRAI_DATA_DIR/imports/mirai)")
    p.set_defaults(func=cmd_import_mirai)

    p = sub.add_parser(
        "score", parents=[debug], help="score a predictions file against a split or a downloaded release"
    )
    p.add_argument("predictions", type=Path, help="a .jsonl, .csv or .parquet file, or a MIRAI round<N>/ directory")
    p.add_argument(
        "--split", required=True, help="a release month's directory (from `mirai download`) or a month YYYY-MM"
    )
    p.add_argument("--sample", action="store_true", help="score against the balanced sample (queries_sample)")
    p.add_argument("--distance", type=_count(1), default=1, help="days between cutoff and query (recorded; default 1)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    p.add_argument("--resamples", type=_count(1, 100_000), default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--lenient", action="store_true", help="score invalid answers as empty, as MIRAI's eval.py does")
    p.add_argument(
        "--relation-query",
        type=Path,
        help="a round directory's files are named by the QueryIds of this MIRAI relation_query.csv",
    )
    p.add_argument("--out", type=Path, help="write scorecard.json and scorecard.md here")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser(
        "evaluate",
        parents=[debug],
        help="run an LLM agent through the evaluation harness on a downloaded release (no Dagster, no agents.yaml)",
        epilog="The flags fill an agents.yaml entry (docs/evaluation.md); unset ones take the registry's defaults.",
    )
    p.add_argument("release", type=Path, help="a release month's directory from `mirai download` (not --only split)")
    p.add_argument("--endpoint", required=True, help="an OpenAI-compatible base URL, e.g. http://host:8000/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument(
        "--api-key-env", help="the environment variable holding the API key (never the key itself; default: no key)"
    )
    p.add_argument(
        "--knowledge-cutoff",
        required=True,
        help="YYYY-MM-DD or YYYY-MM, the model's training-data end: a month not after it is run but contaminated",
    )
    p.add_argument("--queries", choices=("sample", "all"), default="sample", help="queries_sample (default) or all")
    p.add_argument("--distance", type=int, default=1, help="days between the visible history's end and the query")
    p.add_argument("--rounds", type=int, help="runs of every query (default 1; more need --out DIR)")
    p.add_argument("--strategy", help="react (default), direct or cot")
    p.add_argument("--action-type", help="react: single_function (default) or code_block")
    p.add_argument("--mode", help="native (default) or mirai (MIRAI's own loop, docs/mirai.md)")
    p.add_argument("--tools", help="react: full (default), kg or news")
    p.add_argument("--temperature", type=float, help="default 0.4, as MIRAI")
    p.add_argument("--max-steps", type=int, help="react: tool calls per episode (default 20)")
    p.add_argument("--concurrency", type=int, help="episodes at once (default 8)")
    p.add_argument("--requests-per-minute", type=int, help="the endpoint's request limit (default: none)")
    p.add_argument("--tokens-per-minute", type=int, help="the endpoint's token limit (default: none)")
    p.add_argument("--sandbox-memory-mb", type=int, help="react: what each episode's code sandbox may allocate")
    p.add_argument("--price-per-million-input-tokens", type=float, help="USD, for the cost (with the output price)")
    p.add_argument("--price-per-million-output-tokens", type=float, help="USD, for the cost (with the input price)")
    p.add_argument("--max-tokens", type=_count(1), help="per model reply (default 1024)")
    p.add_argument("--seed", type=int, help="sent with every request (default 0)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("predictions.jsonl"),
        help="a .jsonl file (default predictions.jsonl), or a directory for MIRAI's round<N>/ files",
    )
    p.add_argument(
        "--run-dir", type=Path, help="the checkpoint, trajectories and scores.json (default: OUT.run beside OUT)"
    )
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (default 10)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "submit", parents=[debug], help="check a predictions file as the pipeline will and upload it for scoring"
    )
    p.add_argument("predictions", type=Path, help="a .jsonl, .csv or .parquet predictions file (as `mirai score`)")
    p.add_argument("--meta", type=Path, required=True, help="submission.json: model, knowledge_cutoff, contact, ...")
    p.add_argument("--name", required=True, help="the submission's name: letters, digits and '._-', at most 64")
    p.add_argument(
        "--split", type=Path, help="the month's release directory to score against first (default: the data dir's)"
    )
    p.add_argument("--store", help="the release store: s3://bucket/prefix or a path (default: MIRAI_RELEASE_URI)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "serve-release",
        parents=[debug],
        help="serve the demo's release store on 127.0.0.1 and print the commands that download it",
    )
    p.add_argument("--port", type=_port, help="the S3 port (default 8333, testbed/s3.py)")
    p.set_defaults(func=cmd_serve_release)

    p = sub.add_parser(
        "demo", parents=[debug], help="the whole chain on a generated month, served on 127.0.0.1, through Dagster"
    )
    p.add_argument("--month", type=_month, default=DEMO_MONTH, help="the closed month to split and release (YYYY-MM)")
    p.add_argument("--extra-days", type=_count(0), default=3, help="days of the following month to ingest too")
    p.add_argument("--scale", type=_share, default=0.1, help="share of GDELT's events per 15-minute slot (0-1]")
    p.add_argument(
        "--stories", type=_count(1), default=8, help="well-reported stories per day (they make the test queries)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (what is wrong, where to read the usage), not the
    usage block followed by the error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows the usage)\n")


def _problem(exc: Exception) -> str:
    """One line naming what went wrong, for the errors a user meets (no network, no S3 server, no
    credentials, a missing file); anything else is named by its type and message."""
    import requests
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

    from pipeline.http import TransientHTTPError

    if isinstance(exc, requests.ConnectionError):
        url = exc.request.url if exc.request is not None else "the server"
        reason = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
        return f"cannot reach {url}: {reason.group(0) if reason else exc} (no network, or the server is down?)"
    if isinstance(exc, (requests.RequestException, TransientHTTPError)):
        return f"network error: {exc}"
    if isinstance(exc, EndpointConnectionError):
        return (
            f"cannot reach the S3 endpoint: {exc} (is the server running? `mirai serve-release` serves the "
            "demo's; MIRAI_S3_ENDPOINT_URL names the endpoint)"
        )
    if isinstance(exc, NoCredentialsError):
        return f"S3: {exc}: set them in the standard AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
    if isinstance(exc, (BotoCoreError, ClientError)):
        return f"S3: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"


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
            filter(None, ["mirai", args.command, getattr(args, "mirror_command", None), getattr(args, "format", None)])
        )
        if isinstance(exc, CommandError):
            print(f"{command}: error: {exc}", file=sys.stderr)
            return exc.status
        print(f"{command}: error: {_problem(exc)} (--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
