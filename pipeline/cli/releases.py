"""`mirai split`, `release`, `download`, `export mirai`/`predictions`/`hf`, `import mirai` and
`serve-release`: a month's split and release, and MIRAI's file layouts."""

from __future__ import annotations

import argparse
import socket
import sys
from contextlib import ExitStack
from pathlib import Path

import polars as pl

from pipeline.cli.common import (
    CommandError,
    count_arg,
    day_arg,
    month_arg,
    port_arg,
    release_name_arg,
    testbed_module,
)
from pipeline.config import Settings
from pipeline.release.layout import ReleaseError
from pipeline.storage import DataLayout

# The splits, release-store, HTTP and evaluation modules are imported by the command that runs,
# not at start: each would add 7-210 ms to every `mirai --help`.


def cmd_split(args: argparse.Namespace) -> int:
    """Build a month's event database and test split outside Dagster (same code as the assets)."""
    from pipeline.http import utc_now
    from pipeline.splits.database import MonthNotReady, build_event_database
    from pipeline.splits.split import Override, build_split, month_closure

    settings = Settings.from_env()
    now = utc_now()
    if args.check:
        closure = month_closure(args.month, settings.dataset, now)
        print(closure.describe())
        return 0 if closure.closed else 1
    if bool(args.override_by) != bool(args.override_reason):
        print("an override needs both --override-by and --override-reason", file=sys.stderr)
        return 2
    override = Override(args.override_by, args.override_reason, now) if args.override_by else None
    try:
        db = build_event_database(args.month, settings.dataset, settings.articles)
        split = build_split(args.month, settings.dataset, settings.gdelt, now=now, override=override)
    except MonthNotReady as exc:
        print(f"not built: {exc}", file=sys.stderr)
        return 1
    print(f"event database {args.month:%Y-%m}: {db.counts['events']} quads, {db.counts['news']} articles")
    print(f"split {split.directory}: {split.queries.height} queries, sample {split.sample.height}")
    return 0


def add_split(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("split", parents=[debug], help="build a closed month's event database and test split")
    p.add_argument("--month", type=month_arg, required=True, help="YYYY-MM")
    p.add_argument("--check", action="store_true", help="only say whether the month is closed (exit 1 if not)")
    p.add_argument("--override-by", default="", help="operator forcing an open month (recorded in the manifest)")
    p.add_argument("--override-reason", default="", help="why the month is forced (recorded in the manifest)")
    p.set_defaults(func=cmd_split)


def cmd_release(args: argparse.Namespace) -> int:
    """Publish a month's release outside Dagster (same code as the `release` asset)."""
    from pipeline.release.download import ProgressBar
    from pipeline.release.publish import publish_release, release_sources
    from pipeline.release.store_uri import open_store

    settings = Settings.from_env()
    try:
        store = open_store(settings.dataset, settings.network, settings.release)
        # Sized from the files, not from a plan: planning may hash files, and publish_release
        # uploads a new month's files as they are planned.
        bar = ProgressBar(sum(f.path.stat().st_size for f in release_sources(args.month, settings.dataset).files))
        try:
            result = publish_release(
                args.month,
                settings.dataset,
                settings.release,
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


def add_release(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "release", parents=[debug], help="publish a month's release to MIRAI_RELEASE_URI (immutable; re-runs verify)"
    )
    p.add_argument("--month", type=month_arg, required=True, help="YYYY-MM")
    p.set_defaults(func=cmd_release)


def cmd_download(args: argparse.Namespace) -> int:
    """Download and verify a published release (anonymous unless --signed or configured)."""
    from pipeline.release.download import ChecksumMismatch, download_release
    from pipeline.release.store_uri import open_store

    settings = Settings.from_env()
    if args.live and (args.release != "latest" or args.only or args.dest or args.fsync):
        raise CommandError(
            "--live downloads the live history: it takes --through and --out, not a release or its options"
        )
    if not args.live and (args.through or args.out):
        raise CommandError("--through and --out go with --live (a release goes to --dest)")
    try:
        store = open_store(
            settings.dataset,
            settings.network,
            settings.release,
            uri=args.source,
            signed=args.signed or settings.release.signed_download,
        )
        if args.live:
            return _download_live(store, args)
        result = download_release(
            store,
            args.release,
            args.dest or Path("mirai-releases"),
            only=args.only,
            workers=settings.release.concurrency,
            durable=args.fsync,
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


def _download_live(store, args: argparse.Namespace) -> int:
    """`mirai download --live`: the published history days through --through into --out (docs/live.md,
    "The history a participant may use"); errors go to cmd_download's one-line report."""
    from pipeline.live.participate import sync_history

    out = args.out or Path("mirai-live")
    result = sync_history(store, out, args.through)
    synced = [*result.present, *result.downloaded]
    span = f"{min(synced)}..{max(synced)}" if synced else "no day"
    print(
        f"live history {span} in {out / 'database'}: {len(result.downloaded)} days downloaded "
        f"({result.bytes_downloaded:,} bytes, each file sha256-verified), {len(result.present)} already there"
    )
    if args.through is not None and (not synced or max(synced) < args.through.isoformat()):
        newest = f"no day after {max(synced)}" if synced else "no day"
        print(f"{newest} is published yet: --through {args.through} asked for more")
    return 0


def add_download(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("download", parents=[debug], help="download and verify a published release")
    p.add_argument("release", nargs="?", default="latest", type=release_name_arg, help="latest (default) or YYYY-MM")
    p.add_argument("--dest", type=Path, help="files go to DEST/YYYY-MM/ (default mirai-releases)")
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
    p.add_argument(
        "--live",
        action="store_true",
        help="the live history instead: each published day's event database (once; then one new day a round)",
    )
    p.add_argument("--through", type=day_arg, help="with --live: the last day to download (default: every published)")
    p.add_argument("--out", type=Path, help="with --live: files go to OUT/database/ (default mirai-live)")
    p.set_defaults(func=cmd_download)


def cmd_export_mirai(args: argparse.Namespace) -> int:
    """Write a month's database and split as the files MIRAI's scripts read (docs/mirai.md)."""
    from pipeline.splits.mirai_export import export_mirai
    from pipeline.splits.mirai_files import ExportError

    try:
        result = export_mirai(args.month, Settings.from_env().dataset.data_dir, args.out)
    except ExportError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"MIRAI files for {result.month} (database {result.database_months[0]}..{result.database_months[-1]}) in "
        f"{result.directory}: copy its data/ into a MIRAI checkout; the embedding files are yours to make"
    )
    return 0


def cmd_export_predictions(args: argparse.Namespace) -> int:
    """A stored evaluation run's predictions in MIRAI's layout (OUT/round<N>/<QueryId>.json)."""
    from pipeline.evaluation.mirai_predictions import export_predictions, mirai_query_ids

    directory = DataLayout(Settings.from_env().dataset.data_dir).evaluation_dir(
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


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Several releases as one Hugging Face dataset repository (docs/releases.md, "Hugging Face")."""
    from pipeline.release.hf_export import export_hf

    try:
        result = export_hf(args.sources, args.out)
    except ReleaseError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"Hugging Face dataset repository in {result.directory}"
        f"{'' if result.changed else ' (unchanged)'}: releases {', '.join(result.months)}, database months "
        f"{result.database_months[0]}..{result.database_months[-1]}, {len(result.configs)} configs; "
        f"push it with: hf upload <user>/<dataset> {result.directory} . --repo-type dataset"
    )
    return 0


def add_export(sub, debug: argparse.ArgumentParser) -> None:
    export = sub.add_parser("export", parents=[debug], help="write data in another benchmark's layout").add_subparsers(
        dest="format", required=True
    )
    p = export.add_parser("mirai", parents=[debug], help="a month's database and split as MIRAI's data/ files")
    p.add_argument("--month", type=month_arg, required=True, help="YYYY-MM (the split's month)")
    p.add_argument("--out", type=Path, required=True, help="a new or empty directory (or an earlier export)")
    p.set_defaults(func=cmd_export_mirai)

    p = export.add_parser(
        "predictions", parents=[debug], help="a stored evaluation run's predictions as MIRAI writes them"
    )
    p.add_argument("--month", type=month_arg, required=True, help="YYYY-MM")
    p.add_argument("--agent", required=True, help="the agent's name in the registry")
    p.add_argument("--query-set", default="queries", help="queries (default) or queries_sample")
    p.add_argument("--distance", type=count_arg(1), default=1, help="days between the cutoff and the query (default 1)")
    p.add_argument("--out", type=Path, required=True, help="files go to OUT/round<N>/<QueryId>.json")
    p.add_argument("--relation-query", type=Path, help="name files by the QueryIds of this MIRAI relation_query.csv")
    p.set_defaults(func=cmd_export_predictions)

    p = export.add_parser(
        "hf",
        parents=[debug],
        help="several releases as one Hugging Face dataset repository (a config per table and month)",
    )
    p.add_argument("out", type=Path, help="a new or empty directory (or an earlier export), replaced whole")
    p.add_argument(
        "--from",
        dest="sources",
        type=Path,
        nargs="+",
        required=True,
        help="release directories, or directories of them (mirai download --dest, a local store's releases/)",
    )
    p.set_defaults(func=cmd_export_hf)


def cmd_import_mirai(args: argparse.Namespace) -> int:
    """Read MIRAI's published files into a data directory of ours (docs/mirai.md)."""
    from pipeline.splits.mirai_files import ExportError, MiraiFormatError
    from pipeline.splits.mirai_import import import_mirai

    settings = Settings.from_env()
    target = args.data or settings.dataset.data_dir / "imports" / "mirai"
    try:
        result = import_mirai(args.dir, target, distance_days=settings.dataset.agent_distance_days)
    except (MiraiFormatError, ExportError) as exc:
        raise CommandError(f"{exc}; nothing was written") from None
    print(
        f"imported {result.events} events, {result.news} articles and the {result.month} split "
        f"({result.queries} queries, sample {result.sample}) into {result.data_dir}; "
        f"set MIRAI_DATA_DIR={result.data_dir} to evaluate on it"
    )
    return 0


def add_import(sub, debug: argparse.ArgumentParser) -> None:
    imports = sub.add_parser(
        "import", parents=[debug], help="read data from another benchmark's layout"
    ).add_subparsers(dest="format", required=True)
    p = imports.add_parser("mirai", parents=[debug], help="MIRAI's data/ files into a data directory of ours")
    p.add_argument("dir", type=Path, help="a directory holding data/MIRAI/ (or data/MIRAI itself)")
    p.add_argument("--data", type=Path, help="the data directory to write (default: $MIRAI_DATA_DIR/imports/mirai)")
    p.set_defaults(func=cmd_import_mirai)


def cmd_serve_release(args: argparse.Namespace) -> int:
    """Serve the store `mirai demo` published to, on a stable port (testbed/demo.py, loaded by
    testbed_module when the command runs: testbed/ ships with the source checkout only). The demo's
    lock is taken first: a second serve-release (or a running demo) is named as what is in the way,
    not the port it holds."""
    demo = testbed_module("demo")
    port = args.port or testbed_module("s3").SERVE_PORT
    data_dir = Settings.from_env().dataset.data_dir.resolve()
    if not (data_dir / "s3" / "data").is_dir():
        raise CommandError(
            f"no demo release store at {data_dir / 's3'}: run `mirai demo` first "
            "(or set MIRAI_DATA_DIR to the demo's data directory)"
        )
    with ExitStack() as held:
        try:
            held.enter_context(demo.demo_lock(data_dir))
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        with socket.socket() as probe:
            probe.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # as weed's own listener: TIME_WAIT is no obstacle
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise CommandError(
                    f"port {port} on 127.0.0.1 is not free ({exc.strerror}): another program holds it; pass --port N"
                ) from None
        demo.serve_release(data_dir, port)
    return 0


def add_serve_release(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve-release",
        parents=[debug],
        help="serve the demo's release store on 127.0.0.1 and print the commands that download it",
    )
    p.add_argument("--port", type=port_arg, help="the S3 port (default 8333, testbed/s3.py)")
    p.set_defaults(func=cmd_serve_release)
