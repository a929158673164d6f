"""Resolution, scoring and the live leaderboard of live rounds (docs/live.md): thin wrappers of
pipeline/live/resolve.py, score.py and board.py. `live_resolution` is partitioned by the round's
publication day D; the `live_resolution_sensor` (sensors/live_resolution.py) requests it when a
target date of a published round closes, then a `live_leaderboard` refresh."""

from datetime import UTC, date, datetime

import dagster as dg

from assets.live import live_round
from assets.metadata import column_schema
from assets.owners import BENCHMARK_OWNERS
from assets.partitions import daily_partitions
from assets.resources import Dataset, LiveRounds, Network, ReleaseBucket, compose
from pipeline.live.board import RANK_RULE, publish_live_leaderboard, write_live_leaderboard
from pipeline.live.resolve import ANSWERS_SCHEMA, RESOLUTION_VERSION, RoundNotPublished, resolve_round
from pipeline.live.score import score_round
from pipeline.live.status import publish_round_statuses
from pipeline.markdown import markdown_text
from pipeline.release.layout import ReleaseError
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store_uri import open_store


def _scores_table(card: dict) -> str:
    lines = [
        "| submission | baseline | live score [95% CI] | L2 F1 | Brier | event forecast |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in sorted(card["submissions"].items()):
        if not entry.get("scored"):
            lines.append(
                f"| {markdown_text(name)} | {entry['baseline']} | not scored: {markdown_text(entry['reason'][:200])} | | | |"
            )
            continue
        m = entry["metrics"]
        low, high = m["live_score"]["ci95"]
        lines.append(
            f"| {markdown_text(name)} | {entry['baseline']} | {m['live_score']['value']:.2f} [{low:.2f}, {high:.2f}] | "
            f"{m['level2_f1']['value'] if m['level2_f1']['value'] is not None else ''} | {m['brier']['value']:.4f} | "
            f"{entry['occurrence_forecast']} |"
        )
    return "\n".join(lines)


@dg.asset(
    deps=[live_round],
    partitions_def=daily_partitions,
    group_name="live",
    owners=BENCHMARK_OWNERS,
    code_version=RESOLUTION_VERSION,
    kinds={"polars", "parquet"},
    # Each target date's answers/<t>.parquet.
    metadata=column_schema(ANSWERS_SCHEMA),
    description=(
        "The live round published on the partition's day D: each target date's answers once it has closed "
        "(ledger settled, files stored, grace over), written once to `live/<D>/answers/<t>.parquet` and "
        "`live/rounds/<D>/answers-<t>.jsonl` in the release store; then every accepted submission scored "
        "(`live/<D>/scores.json`) and every submission's public status updated (`live/status/<name>.json` "
        "in the release store). Idempotent: a resolved date is never recomputed."
    ),
)
def live_resolution(
    context: dg.AssetExecutionContext,
    dataset: Dataset,
    network: Network,
    live: LiveRounds,
    release_store: ReleaseBucket,
) -> dg.MaterializeResult:
    settings = compose(dataset, network, live, release_store)
    round_day = date.fromisoformat(context.partition_key)
    store = open_store(settings.dataset, settings.network, settings.release)
    try:
        result = resolve_round(round_day, settings.dataset, settings.live, now=datetime.now(UTC), store=store)
    except RoundNotPublished as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ReleaseConflict as exc:  # another writer's answers in the store: an operator must look
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ReleaseError as exc:  # the store is unreachable or refused a request: a retry may pass
        raise dg.Failure(description=str(exc)) from exc
    card = score_round(settings.dataset, round_day)
    statuses = publish_round_statuses(store, settings.dataset.data_dir, round_day)
    answered = sum(d.questions for d in result.dates if d.resolved)
    empty = sum(d.empty for d in result.dates if d.resolved)
    return dg.MaterializeResult(
        metadata={
            **column_schema(ANSWERS_SCHEMA),
            "round": context.partition_key,
            "resolved dates": ", ".join(d.isoformat() for d in result.resolved) or "none yet",
            "newly resolved": ", ".join(d.target.isoformat() for d in result.dates if d.newly) or "none",
            "waiting": dg.MetadataValue.json(result.waiting),
            "questions answered": answered,
            "share empty": dg.MetadataValue.float(round(empty / answered, 4) if answered else 0.0),
            "submissions scored": sum(1 for e in card["submissions"].values() if e.get("scored")),
            "public statuses updated": statuses,
            "scores": dg.MetadataValue.md(_scores_table(card) if card["submissions"] else "no accepted submission"),
            "scores path": dg.MetadataValue.path(
                str(settings.dataset.data_dir / "live" / context.partition_key / "scores.json")
            ),
        }
    )


@dg.asset(
    deps=[live_resolution],
    group_name="live",
    owners=BENCHMARK_OWNERS,
    kinds={"json", "html"},
    code_version=RESOLUTION_VERSION,
    description=f"live/leaderboard.json and live/leaderboard.html, per round and cumulative ({RANK_RULE}); "
    "published to live/ in the release store when they change.",
)
def live_leaderboard(
    dataset: Dataset, network: Network, live: LiveRounds, release_store: ReleaseBucket
) -> dg.MaterializeResult:
    settings = compose(dataset, network, live, release_store)
    written = write_live_leaderboard(settings.dataset)
    published = publish_live_leaderboard(open_store(settings.dataset, settings.network, settings.release), written)
    board = written.board
    top = "\n".join(
        f"{r['rank']}.{' ≈' if r['rank'] != 1 and r['overlaps_leader'] else ''} {markdown_text(r['name'][:80])}: "
        f"{r['live_score']:.2f} [{r['live_score_ci95'][0]:.2f}, {r['live_score_ci95'][1]:.2f}] "
        f"over {r['questions']} questions"
        for r in board["cumulative"][:20]
    )
    if top:  # the page's rule (pipeline/live/board.py), in one line
        top += "\n\n≈: its 95% interval overlaps the leader's"
    return dg.MaterializeResult(
        metadata={
            "rounds": len(board["rounds"]),
            "models": len(board["cumulative"]),
            "cumulative": dg.MetadataValue.md(top or "no scored submission yet"),
            "skipped": dg.MetadataValue.json(board["skipped"][:50]),
            "page": dg.MetadataValue.path(str(written.html_path)),
            "published": ", ".join(published) or "unchanged",
        }
    )
