"""Resolution, scoring and the live leaderboard of live rounds (docs/live.md): thin wrappers of
pipeline/live/resolve.py, score.py and board.py. `live_resolution` is partitioned by the round's
publication day D; the `live_resolution_sensor` (sensors/live_resolution.py) requests it when a
target date of a published round closes, then a `live_leaderboard` refresh."""

from datetime import UTC, date, datetime

import dagster as dg
import polars as pl

from assets.live import live_round
from assets.metadata import column_schema, frame_table
from assets.owners import BENCHMARK_OWNERS
from assets.partitions import daily_partitions
from assets.resources import Dataset, LiveRounds, Network, ReleaseBucket, compose
from pipeline.live.board import RANK_RULE, publish_live_leaderboard, write_live_leaderboard
from pipeline.live.resolve import ANSWERS_COLUMNS, RESOLUTION_VERSION, RoundNotPublished, resolve_round
from pipeline.live.score import score_round
from pipeline.live.status import publish_round_statuses
from pipeline.release.layout import ReleaseError
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store_uri import open_store


def _scores_frame(card: dict) -> pl.DataFrame:
    """One row per submission: its live score with the 95% interval, L2 F1, Brier and whether it
    forecast the event; an unscored one says why (its first 200 characters)."""
    rows = []
    for name, entry in sorted(card["submissions"].items()):
        row = {"submission": name, "baseline": entry["baseline"], "not scored": None}
        if entry.get("scored"):
            m = entry["metrics"]
            low, high = m["live_score"]["ci95"]
            row |= {"live score": m["live_score"]["value"], "ci95_low": low, "ci95_high": high}
            row |= {"L2 F1": m["level2_f1"]["value"], "Brier": m["brier"]["value"]}
            row["event forecast"] = str(entry["occurrence_forecast"])
        else:
            row["not scored"] = entry["reason"][:200]
        rows.append(row)
    floats = dict.fromkeys(("live score", "ci95_low", "ci95_high", "L2 F1", "Brier"), pl.Float64)
    schema = {"submission": pl.String, "baseline": pl.Boolean, **floats, "event forecast": pl.String}
    return pl.DataFrame(rows, schema={**schema, "not scored": pl.String})


@dg.asset(
    deps=[live_round],
    partitions_def=daily_partitions,
    group_name="live",
    owners=BENCHMARK_OWNERS,
    code_version=RESOLUTION_VERSION,
    kinds={"polars", "parquet"},
    # Each target date's answers/<t>.parquet.
    metadata=column_schema(ANSWERS_COLUMNS),
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
            **column_schema(ANSWERS_COLUMNS),
            "round": context.partition_key,
            "resolved dates": ", ".join(d.isoformat() for d in result.resolved) or "none yet",
            "newly resolved": ", ".join(d.target.isoformat() for d in result.dates if d.newly) or "none",
            "waiting": dg.MetadataValue.json(result.waiting),
            "questions answered": answered,
            "share empty": dg.MetadataValue.float(round(empty / answered, 4) if answered else 0.0),
            "submissions scored": sum(1 for e in card["submissions"].values() if e.get("scored")),
            "public statuses updated": statuses,
            "scores": frame_table(_scores_frame(card)),
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
    top = [
        {
            "rank": r["rank"],
            # The page's ≈ (pipeline/live/board.py): the 95% interval overlaps the leader's.
            "overlaps leader": r["rank"] != 1 and bool(r["overlaps_leader"]),
            "model": r["name"][:80],
            "live score": r["live_score"],
            "ci95_low": r["live_score_ci95"][0],
            "ci95_high": r["live_score_ci95"][1],
            "questions": r["questions"],
        }
        for r in board["cumulative"][:20]
    ]
    floats = dict.fromkeys(("live score", "ci95_low", "ci95_high"), pl.Float64)
    schema = {"rank": pl.Int64, "overlaps leader": pl.Boolean, "model": pl.String, **floats, "questions": pl.Int64}
    return dg.MaterializeResult(
        metadata={
            "rounds": len(board["rounds"]),
            "models": len(board["cumulative"]),
            "cumulative": frame_table(pl.DataFrame(top, schema=schema)),
            "skipped": dg.MetadataValue.json(board["skipped"][:50]),
            "page": dg.MetadataValue.path(str(written.html_path)),
            "published": ", ".join(published) or "unchanged",
        }
    )
