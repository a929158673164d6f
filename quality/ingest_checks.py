"""Checks on the slot ledger, next to the raw files they guard."""

from datetime import date

import dagster as dg
import polars as pl

from assets.ingest import gdelt_files
from assets.partitions import daily_partitions
from assets.resources import MiraiSettings
from pipeline.gdelt.ledger import problems, read_ledger, to_markdown
from pipeline.storage import DataLayout


@dg.asset_check(asset=gdelt_files, partitions_def=daily_partitions, blocking=False)
def gdelt_files_all_green(context: dg.AssetCheckExecutionContext, mirai: MiraiSettings) -> dg.AssetCheckResult:
    """Warns when a due file of the day is not landed: GDELT gaps (missing) are normal, corrupt
    and failed files need a look. A warning, not an error: the day keeps every slot it has."""
    day = date.fromisoformat(context.partition_key)
    ledger = read_ledger(DataLayout(mirai.settings().data_dir), day)
    bad = ledger.filter(pl.col("status").is_in(["corrupt", "failed", "pending", "missing"]))
    return dg.AssetCheckResult(
        passed=bad.height == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "not_landed": bad.height,
            "corrupt_or_failed": bad.filter(pl.col("status").is_in(["corrupt", "failed"])).height,
            "details": dg.MetadataValue.md(to_markdown(problems(ledger))),
        },
    )
