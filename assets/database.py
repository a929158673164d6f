"""The monthly event database agents query: event table + news table per month."""

from datetime import date

import dagster as dg

from assets.articles import articles
from assets.events import daily_quads
from assets.metadata import column_schema, table_schema
from assets.owners import DATA_OWNERS
from assets.partitions import monthly_partitions
from assets.resources import ArticleFetcher, Dataset
from pipeline.release.tables import EVENT_DB_COLUMNS, NEWS_DB_COLUMNS
from pipeline.splits.database import (
    DATABASE_VERSION,
    MonthNotReady,
    build_event_database,
)


@dg.asset(
    partitions_def=monthly_partitions,
    # Daily upstreams map onto the month by time window (Dagster's default for time partitions).
    deps=[daily_quads, articles],
    group_name="splits",
    owners=DATA_OWNERS,
    kinds={"polars", "parquet"},
    code_version=DATABASE_VERSION,
    # The events table is the asset's table (its row count); the news table's columns beside it.
    metadata={
        **column_schema(EVENT_DB_COLUMNS),
        "news columns": dg.MetadataValue.table_schema(
            table_schema(NEWS_DB_COLUMNS.schema, NEWS_DB_COLUMNS.descriptions)
        ),
    },
    description="database/{events,news}/month=YYYY-MM.parquet: quads with daily_mentions ≥ "
    "MIRAI_ARTICLE_MIN_MENTIONS that kept at least one filtered article, and those articles.",
)
def event_database(
    context: dg.AssetExecutionContext, dataset: Dataset, fetcher: ArticleFetcher
) -> dg.MaterializeResult:
    month = date.fromisoformat(context.partition_key)
    try:
        db = build_event_database(month, dataset.settings(), fetcher.settings())
    except MonthNotReady as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    return dg.MaterializeResult(
        metadata={
            **column_schema(EVENT_DB_COLUMNS, db.events.schema),
            "news columns": dg.MetadataValue.table_schema(table_schema(db.news.schema, NEWS_DB_COLUMNS.descriptions)),
            "dagster/row_count": db.events.height,
            **db.counts,
        }
    )
