"""`mirai score` and `mirai submit`: a predictions file scored against a split, and checked and
uploaded for the pipeline to score (docs/evaluation.md)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pipeline.cli.common import CommandError, count_arg, day_arg
from pipeline.config import Settings
from pipeline.storage import atomic_write_bytes

# The evaluation, live and release-store modules are imported by the command that runs, not at
# start: each would add 10-300 ms to every `mirai --help`.


def cmd_score(args: argparse.Namespace) -> int:
    """Score a predictions file against a split (docs/evaluation.md, "Score your own predictions")."""
    from pipeline.evaluation.score_inputs import ScoringError, split_directory
    from pipeline.evaluation.scoring import InvalidPredictions, bounded, score_predictions

    try:
        data_dir = None if Path(args.split).is_dir() else Settings.from_env().dataset.data_dir
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
            limit=args.limit,
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


def add_score(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "score", parents=[debug], help="score a predictions file against a split or a downloaded release"
    )
    p.add_argument("predictions", type=Path, help="a .jsonl, .csv or .parquet file, or a MIRAI round<N>/ directory")
    p.add_argument(
        "--split", required=True, help="a release month's directory (from `mirai download`) or a month YYYY-MM"
    )
    p.add_argument("--sample", action="store_true", help="score against the balanced sample (queries_sample)")
    p.add_argument(
        "--distance", type=count_arg(1), default=1, help="days between cutoff and query (recorded; default 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    p.add_argument("--resamples", type=count_arg(1, 100_000), default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--lenient", action="store_true", help="score invalid answers as empty, as MIRAI's eval.py does")
    p.add_argument(
        "--relation-query",
        type=Path,
        help="a round directory's files are named by the QueryIds of this MIRAI relation_query.csv",
    )
    p.add_argument(
        "--limit",
        type=count_arg(1),
        help="score only the N queries of `mirai evaluate --limit N` (the scorecard says it is a subset)",
    )
    p.add_argument("--out", type=Path, help="write scorecard.json and scorecard.md here")
    p.set_defaults(func=cmd_score)


def cmd_submit(args: argparse.Namespace) -> int:
    """Check a predictions file and its submission.json as the pipeline will, then upload them to the
    release store's submissions/ (docs/evaluation.md, "Submissions")."""
    from pipeline.evaluation.score_inputs import ScoringError, split_directory
    from pipeline.evaluation.scoring import InvalidPredictions, bounded
    from pipeline.evaluation.submission_metadata import LiveMetadata, cutoff_rule
    from pipeline.evaluation.submissions import SubmissionError
    from pipeline.evaluation.submit import check_name_free, prepare, score_locally
    from pipeline.live.publication import store_deadline
    from pipeline.live.submissions import check_live_locally, deadline_courtesy
    from pipeline.release.store_uri import open_store

    prepared, problems = prepare(args.name, args.predictions, args.meta)
    if prepared is None:
        for line in bounded(problems):
            print(line, file=sys.stderr)
        raise CommandError(f"{len(problems)} problem(s); nothing was uploaded")
    round_named = prepared.meta.round if isinstance(prepared.meta, LiveMetadata) else None
    if args.live is not None and round_named != args.live:
        named = f"names round {round_named}" if round_named else 'has no "round": a monthly submission'
        raise CommandError(f"--live {args.live}: {args.meta} {named}; nothing was uploaded", status=2)
    settings = Settings.from_env()
    store = open_store(settings.dataset, settings.network, settings.release, uri=args.store)
    try:
        check_name_free(store, prepared.name)
    except SubmissionError as exc:
        raise CommandError(str(exc)) from None
    if isinstance(prepared.meta, LiveMetadata):
        manifest, problems = check_live_locally(prepared, store)
        if manifest:
            late, warning = deadline_courtesy(store, manifest, datetime.now(UTC), timedelta(minutes=args.warn_minutes))
            if late:
                raise CommandError(late)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        if problems:
            for line in bounded(problems):
                print(line, file=sys.stderr)
            raise CommandError(f"{len(problems)} problem(s); nothing was uploaded")
        # The store's clock decides: in a replayed round (the demo) it is far from the published time.
        due, how = store_deadline(store, manifest)
        print(
            f"round {prepared.meta.round}: accepted if the upload reaches the store before "
            f"{due.astimezone(UTC).isoformat()} (store time: {how}; published deadline {manifest.get('deadline')})"
        )
        return _upload(store, prepared)
    month = prepared.meta.month
    try:
        split = split_directory(str(args.split) if args.split else month, settings.dataset.data_dir)
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
        subset = result.card.get("subset")
        if subset:  # leaderboard rows are compared over whole query sets (docs/evaluate-your-agent.md)
            raise CommandError(
                f"these predictions answer the --limit {subset['limit']} subset of the {subset['of']} queries "
                f"(scored above): the leaderboard ranks runs over the whole {month} {prepared.meta.query_set}; "
                "evaluate every query (no --limit) to submit; nothing was uploaded"
            )
    eligible, why = cutoff_rule(prepared.meta)
    if not eligible:
        print(why, file=sys.stderr)
    return _upload(store, prepared)


def _upload(store, prepared) -> int:
    from pipeline.evaluation.submissions import SubmissionError
    from pipeline.evaluation.submit import upload

    try:
        upload(store, prepared)
    except SubmissionError as exc:
        raise CommandError(str(exc)) from None
    print(f"submitted {prepared.name!r} to {store.description} (submissions/{prepared.name}/)")
    return 0


def add_submit(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "submit", parents=[debug], help="check a predictions file as the pipeline will and upload it for scoring"
    )
    p.add_argument("predictions", type=Path, help="a .jsonl, .csv or .parquet predictions file (as `mirai score`)")
    p.add_argument("--meta", type=Path, required=True, help="submission.json: model, knowledge_cutoff, contact, ...")
    p.add_argument("--name", required=True, help="the submission's name: letters, digits and '._-', at most 64")
    p.add_argument(
        "--split", type=Path, help="the month's release directory to score against first (default: the data dir's)"
    )
    p.add_argument(
        "--live",
        type=day_arg,
        metavar="D",
        help="a live round's submission: submission.json must name round D; refused here once its deadline passed",
    )
    p.add_argument(
        "--warn-minutes",
        type=count_arg(0),
        default=30,
        metavar="N",
        help="a live submission: warn when less than N minutes are left before the deadline (default 30)",
    )
    p.add_argument("--store", help="the release store: s3://bucket/prefix or a path (default: MIRAI_RELEASE_URI)")
    p.set_defaults(func=cmd_submit)
