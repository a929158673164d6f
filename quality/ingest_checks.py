"""Checks on the slot ledger and the parsed files, next to the files they guard."""

import time
from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl

from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.metadata import frame_table
from assets.partitions import daily_partitions
from assets.resources import Dataset, compose
from pipeline.gdelt.integrity import verify_day
from pipeline.gdelt.ledger import GREEN, problems, read_ledger
from pipeline.markdown import markdown_text
from pipeline.storage import DataLayout


@dg.asset_check(asset=gdelt_files, partitions_def=daily_partitions, blocking=False)
def gdelt_files_all_green(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """Warns when a file that GDELT's index lists for the day is not landed (pending, missing,
    corrupt, failed or quarantined). A slot GDELT never published (not in its master or
    last-update list, which gdelt_files reads) passes: GDELT's gaps are normal and counted in
    ``gdelt_gaps``. A quarantined file (GDELT's index vouches for bytes that are not a usable
    file: see docs/data-layout.md, "Hostile GDELT files") is named with its reason. A warning,
    not an error: the day keeps every slot it has and its events are built from them."""
    day = date.fromisoformat(context.partition_key)
    ledger = read_ledger(DataLayout(Path(dataset.data_dir)), day)
    not_landed = ledger.filter(~pl.col("status").is_in([*GREEN, "not_due"]))
    # Unlisted is GDELT's own gap (or, inside the grace period, a slot not published yet); an
    # index copy that stopped refreshing shows in gdelt_files' index_refresh and gdelt_freshness.
    gaps = not_landed.filter(~pl.col("listed").fill_null(False))
    bad = not_landed.filter(pl.col("listed").fill_null(False))
    quarantined = ledger.filter(pl.col("status") == "quarantined").sort("slot", "kind")
    # The UI renders a check's description as Markdown, and a reason may quote a GDELT zip's
    # member names: inert Markdown, as in the details table.
    named = [
        f"{row['slot']:%Y%m%d%H%M%S}.{row['kind']} ({markdown_text(str(row['last_error']))})"
        for row in quarantined.iter_rows(named=True)
    ]
    said = []
    if named:
        said.append(
            f"{len(named)} file(s) quarantined, not fetched or parsed again until GDELT's index "
            f"lists other bytes for them: {'; '.join(named)}"
        )
    if bad.height > len(named):
        said.append(f"{bad.height - len(named)} file(s) GDELT's index lists are not landed (see details)")
    if gaps.height:
        said.append(
            f"{gaps.height} slot file(s) not in GDELT's index (not published by GDELT, or not yet): not a failure"
        )
    return dg.AssetCheckResult(
        passed=bad.height == 0,
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(said) or None,
        metadata={
            "not_landed": bad.height,
            "corrupt_or_failed": bad.filter(pl.col("status").is_in(["corrupt", "failed"])).height,
            "quarantined": quarantined.height,
            "gdelt_gaps": gaps.height,
            "details": frame_table(problems(bad)),
        },
    )


def _listing(problems_by_path: dict[str, str]) -> dg.MetadataValue:
    lines = [f"- {markdown_text(str(path))}: {markdown_text(what)}" for path, what in problems_by_path.items()]
    return dg.MetadataValue.md("\n".join(lines) or "none")


def _parsed_files_intact(asset: dg.AssetsDefinition, kind: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=asset, name="parsed_files_intact", partitions_def=daily_partitions, blocking=True)
    def check(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
        """Every parsed file of the day has the sha256 and size recorded when it was written, and
        every landed raw zip still has the md5 GDELT listed. A damaged parsed file fails with
        ERROR (blocking: the events are not built from it in this run) and the asset's next
        materialisation quarantines and re-parses it. A damaged raw zip only warns: the parsed
        files were built from its verified bytes."""
        settings = compose(dataset)
        layout = DataLayout(settings.dataset.data_dir)
        started = time.perf_counter()
        found = verify_day(layout, kind, date.fromisoformat(context.partition_key), settings.dataset.day_lock_timeout_s)
        metadata = {
            "files_checked": found.files,
            "bytes_checked": found.bytes,
            "raw_files_checked": found.raw_files,
            "raw_bytes_checked": found.raw_bytes,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "damaged": _listing(found.damaged),
            "raw_damaged": _listing(found.raw_damaged),
        }
        asset_name = asset.key.to_user_string()
        if found.damaged:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata=metadata,
                description=f"damaged: {', '.join(found.damaged)}. The next materialisation of {asset_name} "
                "moves what is damaged to quarantine/parsed/ and parses the affected slots again from their raw zips.",
            )
        if found.raw_damaged:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                metadata=metadata,
                description=f"{len(found.raw_damaged)} raw zip(s) no longer match GDELT's md5: "
                f"{', '.join(found.raw_damaged)}. Landed zips are not downloaded again by themselves; "
                "see docs/operations.md (asset checks) to re-land them.",
            )
        if not found.recorded and found.files:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                metadata=metadata,
                description=f"the day was parsed before digests were recorded: the next materialisation of "
                f"{asset_name} records them",
            )
        return dg.AssetCheckResult(passed=True, metadata=metadata)

    return check


gdelt_events_intact = _parsed_files_intact(gdelt_events, "export")
gdelt_mentions_intact = _parsed_files_intact(gdelt_mentions, "mentions")
