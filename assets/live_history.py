"""The live history (docs/live.md, "The history a participant may use"): day d's event database
tables, published once to MIRAI_RELEASE_URI under live/history/<d>/ by pipeline/live/history.py,
for live participants to forecast from."""

from datetime import date

import dagster as dg

from assets.articles import articles
from assets.events import daily_quads
from assets.live import replay_clock
from assets.metadata import column_schema, table_schema
from assets.owners import BENCHMARK_OWNERS
from assets.partitions import daily_partitions
from assets.resources import ArticleFetcher, Dataset, GdeltFeed, Network, ReleaseBucket, compose
from pipeline.live.history import HISTORY_FORMAT, HistoryRefused, publish_history_day
from pipeline.release.layout import MANIFEST_NAME, ReleaseError, live_history_key
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store_uri import open_store
from pipeline.release.tables import EVENT_DB_COLUMNS, NEWS_DB_COLUMNS


class LiveHistoryConfig(dg.Config):
    """The clock of a replayed past day (an ISO time such as 2024-01-05T02:00:00+00:00): a day is
    published only once it is over on that clock. Empty in live operation: now."""

    replay_at: str = ""


@dg.asset(
    partitions_def=daily_partitions,
    # A backfill (a new store's first history, a gap) is one run over its days, not a run a day:
    # each day is a few small files, and Dagster's per-run start-up would be most of the time.
    backfill_policy=dg.BackfillPolicy.single_run(),
    # The day's own daily files (the same partition): what the monthly database is built from.
    deps=[daily_quads, articles],
    group_name="live",
    owners=BENCHMARK_OWNERS,
    kinds={"s3", "parquet"},
    code_version=HISTORY_FORMAT,
    # The events table is the asset's table, the news table's columns beside it (as event_database).
    metadata={
        **column_schema(EVENT_DB_COLUMNS),
        "news columns": dg.MetadataValue.table_schema(
            table_schema(NEWS_DB_COLUMNS.schema, NEWS_DB_COLUMNS.descriptions)
        ),
    },
    description="`live/history/<d>/` in MIRAI_RELEASE_URI: day d's event database (events.parquet, news.parquet: "
    "the monthly database's tables of that day, by its code) and manifest.json (written once, last); "
    "live/history/index.json. Only once d is over and its daily files are in; a re-run that builds the same "
    "tables changes nothing, one that builds others is refused. A run over several days (a backfill) "
    "publishes them oldest first and stops at the first it cannot publish.",
)
def live_history(
    context: dg.AssetExecutionContext,
    config: LiveHistoryConfig,
    dataset: Dataset,
    network: Network,
    gdelt: GdeltFeed,
    fetcher: ArticleFetcher,
    release_store: ReleaseBucket,
) -> dg.MaterializeResult:
    settings = compose(dataset, network, gdelt, fetcher, release_store)
    now = replay_clock(config.replay_at)
    store = open_store(settings.dataset, settings.network, settings.release)
    results = []
    # Oldest first: a day that cannot be published stops the run with the earlier ones in place.
    for key in sorted(context.partition_keys):
        day = date.fromisoformat(key)
        try:
            results.append(
                publish_history_day(day, settings.dataset, settings.articles, settings.gdelt, store, now=now)
            )
        except (
            HistoryRefused,
            ReleaseConflict,
        ) as exc:  # a retry cannot help: the clock, the files or the store decide
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        except ReleaseError as exc:  # the store is unreachable
            raise dg.Failure(description=str(exc)) from exc
    last = results[-1]
    return dg.MaterializeResult(
        metadata={
            **column_schema(EVENT_DB_COLUMNS),
            "news columns": dg.MetadataValue.table_schema(
                table_schema(NEWS_DB_COLUMNS.schema, NEWS_DB_COLUMNS.descriptions)
            ),
            "dagster/row_count": sum(r.rows["events"] for r in results),
            "news": sum(r.rows["news"] for r in results),
            "days": len(results),
            "bytes": sum(meta["bytes"] for r in results for meta in r.manifest["files"].values()),
            "manifest_key": live_history_key(last.day.isoformat(), MANIFEST_NAME),
            "published_now": sum(r.published_now for r in results),
            "index_updated": any(r.index_written for r in results),
        }
    )
