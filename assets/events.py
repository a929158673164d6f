"""Normalised international events and daily quads (MIRAI's rules, pipeline/events/normalize.py)."""

from datetime import date

import dagster as dg

from assets.ingest import gdelt_events, gdelt_mentions
from assets.metadata import column_schema, frame_table
from assets.owners import DATA_OWNERS
from assets.partitions import daily_partitions
from assets.resources import Dataset
from pipeline.events.daily import build_daily_quads, build_events
from pipeline.events.normalize import EVENTS_COLUMNS, RULES_VERSION, UNMAPPED_CODES_COLUMNS
from pipeline.events.quads import QUADS_COLUMNS

PREVIOUS_DAY = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "events",
            # Rules 1 and 6 read every earlier day's key files, which each day's events write:
            # declared as a dependency on the previous day, so an asset backfill runs the days
            # oldest first (docs/operations.md, "Backfills").
            deps=[gdelt_events, dg.AssetDep("events", partition_mapping=PREVIOUS_DAY)],
            description="One row per kept international event (date, s, r, o, …) after MIRAI's rules, "
            "with every excluded row counted under the first rule it failed.",
            kinds={"polars", "parquet"},
            group_name="events",
            owners=DATA_OWNERS,
            code_version=RULES_VERSION,
            metadata=column_schema(EVENTS_COLUMNS),
        ),
        dg.AssetSpec(
            "unmapped_codes",
            deps=[gdelt_events],
            description="Actor country codes the CAMEO→ISO table does not know (a schema-drift signal).",
            kinds={"polars", "parquet"},
            group_name="events",
            owners=DATA_OWNERS,
            code_version=RULES_VERSION,
            metadata=column_schema(UNMAPPED_CODES_COLUMNS),
        ),
    ],
    partitions_def=daily_partitions,
)
def events(context: dg.AssetExecutionContext, dataset: Dataset):
    day = date.fromisoformat(context.partition_key)
    result = build_events(day, dataset.settings())
    n = result.normalized
    yield dg.MaterializeResult(
        asset_key="events",
        metadata={
            **column_schema(EVENTS_COLUMNS, n.events.schema),
            "dagster/row_count": n.events.height,
            "input_rows": n.input_rows,
            **{f"excluded_{reason}": count for reason, count in n.exclusions.items()},
            "history_days": result.history_days,
            **n.metadata,
        },
    )
    yield dg.MaterializeResult(
        asset_key="unmapped_codes",
        metadata={
            **column_schema(UNMAPPED_CODES_COLUMNS, n.unmapped_codes.schema),
            "dagster/row_count": n.unmapped_codes.height,
            "codes": frame_table(n.unmapped_codes),
        },
    )


@dg.asset(
    partitions_def=daily_partitions,
    deps=["events", gdelt_mentions],
    group_name="events",
    owners=DATA_OWNERS,
    kinds={"polars", "parquet"},
    code_version=RULES_VERSION,
    metadata=column_schema(QUADS_COLUMNS),
    description="One row per (date, s, r, o): daily mentions, event count, article URLs and the "
    "number of distinct first-day WEB mention URLs.",
)
def daily_quads(context: dg.AssetExecutionContext, dataset: Dataset) -> dg.MaterializeResult:
    quads = build_daily_quads(date.fromisoformat(context.partition_key), dataset.settings())
    return dg.MaterializeResult(
        metadata={
            **column_schema(QUADS_COLUMNS, quads.schema),
            "dagster/row_count": quads.height,
            "quads_ge_50_mentions": quads.filter(quads["daily_mentions"] >= 50).height,
            "quads_ge_100_mentions": quads.filter(quads["daily_mentions"] >= 100).height,
        }
    )
