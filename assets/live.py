"""Live rounds (docs/live.md): the round of day D, published to MIRAI_RELEASE_URI under live/ with
its baselines' submissions, by pipeline/live/publication.py. Submissions to it are accepted by the
`submission` asset (assets/submissions.py), like any other."""

from datetime import UTC, date, datetime

import dagster as dg

from assets.articles import articles
from assets.events import daily_quads
from assets.metadata import column_schema
from assets.owners import BENCHMARK_OWNERS
from assets.partitions import LIVE_WINDOW, daily_partitions
from assets.resources import Dataset, GdeltFeed, LiveRounds, Network, ReleaseBucket, compose
from pipeline.live.publication import ROUND_FORMAT, RoundRefused, publish_round
from pipeline.live.rounds import QUESTIONS_COLUMNS
from pipeline.markdown import markdown_text
from pipeline.release.layout import ReleaseError
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store_uri import open_store


class LiveRoundConfig(dg.Config):
    """The clock of a replayed past round (the demo replays generated days): an ISO time such as
    2024-01-05T02:00:00+00:00. Empty in live operation: the round is published now. Acceptance
    does not read it: the deadline is judged on the store's clock (docs/live.md, "Timeline")."""

    replay_at: str = ""


def replay_clock(replay_at: str) -> datetime:
    """The run's clock: ``replay_at`` (a replayed past day), or now when it is empty."""
    try:
        now = datetime.fromisoformat(replay_at) if replay_at else datetime.now(UTC)
    except ValueError as exc:
        raise dg.Failure(description=f"replay_at {replay_at!r} is not an ISO time", allow_retries=False) from exc
    if now.tzinfo is None:
        raise dg.Failure(description=f"replay_at {replay_at!r} has no time zone", allow_retries=False)
    return now


@dg.asset(
    partitions_def=daily_partitions,
    deps=[
        dg.AssetDep(daily_quads, partition_mapping=LIVE_WINDOW),
        dg.AssetDep(articles, partition_mapping=LIVE_WINDOW),
    ],
    group_name="live",
    owners=BENCHMARK_OWNERS,
    kinds={"s3"},
    code_version=ROUND_FORMAT,
    # The round's questions.parquet in the data directory (the store gets questions.jsonl without the stratum).
    metadata=column_schema(QUESTIONS_COLUMNS),
    description="`live/rounds/<D>/` in MIRAI_RELEASE_URI: questions (t, s, o) for t = D + each horizon, drawn from "
    "the daily files of D - window .. D - 1 only, and manifest.json (written once, last); the recurrency and "
    "frequency baselines' submissions; live/index.json. Refused from the round's deadline on; a re-run that builds "
    "the same round changes nothing.",
)
def live_round(
    context: dg.AssetExecutionContext,
    config: LiveRoundConfig,
    dataset: Dataset,
    network: Network,
    gdelt: GdeltFeed,
    release_store: ReleaseBucket,
    live: LiveRounds,
) -> dg.MaterializeResult:
    day = date.fromisoformat(context.partition_key)
    # The GDELT feed's URL is the round's recorded source, as it is a split's.
    settings = compose(dataset, network, gdelt, release_store, live)
    now = replay_clock(config.replay_at)
    try:
        result = publish_round(
            day,
            settings.dataset,
            settings.gdelt,
            settings.live,
            open_store(settings.dataset, settings.network, settings.release),
            now=now,
        )
    except (RoundRefused, ReleaseConflict) as exc:  # a retry cannot help: the timeline or the store decides
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ReleaseError as exc:  # the store is unreachable, or no window file yet
        raise dg.Failure(description=str(exc)) from exc
    manifest = result.manifest
    return dg.MaterializeResult(
        metadata={
            **column_schema(QUESTIONS_COLUMNS),
            "questions": result.questions,
            "pairs_active": result.drawn["active"],
            "pairs_quiet": result.drawn["quiet"],
            "pool_active": result.pools["active"],
            "pool_quiet": result.pools["quiet"],
            "deadline": manifest["deadline"],
            "target_dates": ", ".join(manifest["target_dates"]),
            "seed": str(manifest["sampler"]["seed"]),
            "days_missing": ", ".join(manifest["window"]["days_missing"]) or "none",
            "manifest_key": result.manifest_key,
            "published_now": result.published_now,
            "baselines": dg.MetadataValue.md(
                "\n".join(f"- {markdown_text(n)}: {markdown_text(s)}" for n, s in result.baselines.items())
            ),
            "index_updated": result.index_written,
        }
    )
