"""The monthly test split: queries, balanced sample, figures, manifest and dataset card."""

from datetime import date

import dagster as dg

from assets.database import event_database
from assets.metadata import column_schema, png_metadata
from assets.owners import DATA_OWNERS
from assets.partitions import monthly_partitions
from assets.resources import Dataset, GdeltFeed
from pipeline.http import utc_now
from pipeline.release.tables import QUERIES_COLUMNS
from pipeline.splits.database import MonthNotReady
from pipeline.splits.schema import SPLIT_VERSION
from pipeline.splits.split import Override, build_split


class SplitConfig(dg.Config):
    """Set both to split a month that is not closed (e.g. GDELT lost slots the ledger still calls
    pending); the override, who and why, is written into the manifest and the dataset card."""

    override_by: str = ""
    override_reason: str = ""


@dg.asset(
    partitions_def=monthly_partitions,
    deps=[event_database],
    group_name="splits",
    owners=DATA_OWNERS,
    kinds={"polars", "parquet"},
    code_version=SPLIT_VERSION,
    # queries.parquet's and queries_sample.parquet's.
    metadata=column_schema(QUERIES_COLUMNS),
    description="splits/YYYY-MM/: queries.parquet, queries_sample.parquet, manifest.json (sha256 of "
    "every file), README.md dataset card and its figures. Built only for a closed month.",
)
def test_split(
    context: dg.AssetExecutionContext, config: SplitConfig, dataset: Dataset, gdelt: GdeltFeed
) -> dg.MaterializeResult:
    # The GDELT feed's URL is the split's recorded source (the article profile comes from the database month).
    month = date.fromisoformat(context.partition_key)
    now = utc_now()
    override = None
    if config.override_by or config.override_reason:
        if not (config.override_by and config.override_reason):
            raise dg.Failure("an override needs both override_by and override_reason")
        override = Override(by=config.override_by, reason=config.override_reason, at=now)
    try:
        split = build_split(month, dataset.settings(), gdelt.settings(), now=now, override=override)
    except MonthNotReady as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    manifest = split.manifest
    figures = {name: png_metadata(split.directory / name) for name in manifest["files"] if name.endswith(".png")}
    return dg.MaterializeResult(
        metadata={
            **column_schema(QUERIES_COLUMNS, split.queries.schema),
            "dagster/row_count": split.queries.height,
            "sample": split.sample.height,
            "path": dg.MetadataValue.path(str(split.directory)),
            "override": dg.MetadataValue.json(manifest["override"]) if override else "none",
            # Ledger rows: an export and a mentions file per 15-minute slot (the demo's summary
            # counts slots, i.e. exports); the manifest calls these counts "slots" too.
            "ledger files (2 per slot)": dg.MetadataValue.json(manifest["counts"]["slots"]),
            "queries sha256": manifest["files"]["queries.parquet"]["sha256"],
            **figures,
        }
    )
