"""GDELT ingestion assets: verified raw files + slot ledger, then typed parquet per slot."""

from datetime import date

import dagster as dg

from assets.metadata import column_schema, frame_table, png_bytes_metadata
from assets.owners import DATA_OWNERS
from assets.partitions import daily_partitions
from assets.resources import Dataset, GdeltFeed, Network
from pipeline.gdelt.ingest import PARSED_FORMAT_VERSION, ingest_day, parse_day
from pipeline.gdelt.ledger import LEDGER_COLUMNS, LEDGER_VERSION, problems
from pipeline.gdelt.schema import COLUMNS_BY_KIND
from pipeline.markdown import markdown_text
from pipeline.storage import DataLayout


@dg.asset(
    partitions_def=daily_partitions,
    group_name="ingestion",
    owners=DATA_OWNERS,
    kinds={"http"},
    code_version=LEDGER_VERSION,
    # The day's table is its slot ledger (ledger/<day>.parquet); the zips are GDELT's own.
    metadata=column_schema(LEDGER_COLUMNS),
    # Every run of every day downloads from the one GDELT host: the pool caps how many runs do so
    # at once across the deployment (a backfill of many days must not hammer GDELT or starve the
    # live 15-minute run); limits in deploy/dagster.yaml and docs/deploy.md.
    pool="gdelt_http",
    # File-level faults are retried inside the run and recorded in the ledger; this covers what
    # fails the whole run (GDELT's index unreachable with no cached copy, a lock held too long).
    retry_policy=dg.RetryPolicy(max_retries=2, delay=60, backoff=dg.Backoff.EXPONENTIAL),
    description="Every 15-minute GDELT 2.0 export and mentions zip of the day, verified against "
    "GDELT's size/md5 index, plus the slot ledger (landed, late, pending, missing, corrupt, failed, "
    "quarantined).",
)
def gdelt_files(
    context: dg.AssetExecutionContext, dataset: Dataset, network: Network, gdelt: GdeltFeed
) -> dg.MaterializeResult:
    day = date.fromisoformat(context.partition_key)
    settings = dataset.settings()
    result = ingest_day(day, settings, network.settings(), gdelt.settings(), log=context.log.info)
    counts = result.counts
    context.log.info(f"{day}: {counts}")
    return dg.MaterializeResult(
        metadata={
            **_ledger_month(context, settings.data_dir, day),
            **column_schema(LEDGER_COLUMNS, result.ledger.schema),
            **{f"files_{status}": count for status, count in counts.items()},
            "downloaded_this_run": result.downloaded,
            "index_refresh": f"{result.index_refresh.mode} ({result.index_refresh.bytes_transferred} bytes)",
            "problems": frame_table(problems(result.ledger)),
        }
    )


def _ledger_month(context: dg.AssetExecutionContext, data_dir: str, day: date) -> dict[str, dg.MetadataValue]:
    """The month up to ``day``, one cell per slot: where the day's problems sit among the others'.
    A picture only: another day's damaged ledger leaves it out with a warning, never fails the
    day's ingestion (that day's own run reports its ledger)."""
    # Imported here: matplotlib is ~0.4 s of the start of every Dagster process, which imports
    # this module through the definitions (webserver, daemon, each run and step worker).
    from pipeline.gdelt.ledger_figure import month_heatmap_png, month_slot_states, read_month_ledgers

    try:
        month = month_slot_states(read_month_ledgers(DataLayout(data_dir), day), day)
        return {"ledger_month": png_bytes_metadata("ledger_month", month_heatmap_png(month))}
    except Exception as exc:  # any failure of the picture leaves the ingestion as it is
        context.log.warning(f"ledger_month not drawn: {type(exc).__name__}: {str(exc)[:300]}")
        return {}


def _parsed_asset(kind: str):
    @dg.asset(
        name=f"gdelt_{'events' if kind == 'export' else 'mentions'}",
        partitions_def=daily_partitions,
        deps=[gdelt_files],
        group_name="ingestion",
        owners=DATA_OWNERS,
        kinds={"polars", "parquet"},
        code_version=PARSED_FORMAT_VERSION,
        metadata=column_schema(COLUMNS_BY_KIND[kind]),
        description=f"Typed GDELT 2.0 {kind} rows, one parquet file per landed slot; malformed lines "
        "go to parsed/rejects with file, line number, reason and the line's first 4 KiB, length and sha256. "
        "Each file's sha256 is recorded in parsed/digests; a file that no longer matches is quarantined and "
        "parsed again. A raw file that cannot be parsed as a whole (wrong column count, implausibly many "
        "lines) is quarantined and its slot marked so in the ledger; the day's other slots are written.",
    )
    def parsed(context: dg.AssetExecutionContext, dataset: Dataset, gdelt: GdeltFeed) -> dg.MaterializeResult:
        result = parse_day(date.fromisoformat(context.partition_key), kind, dataset.settings(), gdelt.settings())
        return dg.MaterializeResult(
            metadata={
                # Each slot's file holds exactly the kind's schema (parse.py's ParsedFile.rows).
                **column_schema(COLUMNS_BY_KIND[kind]),
                "dagster/row_count": result.rows,
                "rejects": result.rejects,
                "files": result.files,
                "parsed_this_run": result.parsed,
                # File names come from GDELT's index, reasons may quote a file: inert Markdown.
                "quarantined_this_run": dg.MetadataValue.md(
                    "\n".join(f"- {markdown_text(str(path))}" for path in result.quarantined) or "none"
                ),
                "refused_this_run": dg.MetadataValue.md(
                    "\n".join(
                        f"- {markdown_text(str(path))}: {markdown_text(why)}" for path, why in result.refused.items()
                    )
                    or "none"
                ),
            }
        )

    return parsed


gdelt_events = _parsed_asset("export")
gdelt_mentions = _parsed_asset("mentions")
